#include "fuse/fuse.h"

#include "graph/pass_registry.h"

#include <ATen/ATen.h>

#include <mutex>
#include <optional>
#include <sstream>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "core/error.h"
#include "graph/op_registry.h"
#include "graph/select.h"

namespace whittle::fuse {

namespace detail {
void register_qat();  // qat_batchnorm.cpp
}

namespace {

void register_threshold_op() {
  OpTraits t;
  t.kind = "threshold_sign";
  t.description = "binary activation from a per-channel threshold: +1 where direction·(x − threshold) ≥ 0, else −1 (BN + sign)";
  t.channel_flow = ChannelFlow::kPassThrough;
  t.required_buffers = {"threshold", "direction"};
  t.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return std::vector<at::Tensor>{apply_sign_threshold(in[0], n.buffers.at("threshold"), n.buffers.at("direction"))};
  };
  t.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    const at::Tensor& th = n.buffers.at("threshold");
    const at::Tensor& d = n.buffers.at("direction");
    if (in[0].size() < 2 || th.dim() != 1 || th.size(0) != in[0][1] || d.sizes() != th.sizes())
      throw Error("node '" + n.name + "' (threshold_sign): input " + shape_str(in[0]) + " does not fit threshold " +
                  shape_str(th.sizes().vec()) + " and direction " + shape_str(d.sizes().vec()));
    return std::vector<Shape>{in[0]};
  };
  register_op(std::move(t));
}

// The schema of a fuse pass's options struct O: its BN nodes (or RepVGG roots) to consider.
template <class O>
const OptionsSchema<O>& selection_schema() {
  static const auto schema = OptionsSchema<O>()
                                 .add("targets", &O::targets, "nodes to consider: names, op kinds or re:<regex> (default: all)")
                                 .add("ignore", &O::ignore, "nodes to leave alone");
  return schema;
}

struct NoOptions {};

// Every pattern of the call's targets and ignore matches a node of `g`; else a usage error naming
// the option as the call spells it.
template <class O>
void check_selection(const Graph& g, const O& o, const PassCall& call) {
  try {
    require_matches(g, o.targets, call.source.key("targets"));
    require_matches(g, o.ignore, call.source.key("ignore"));
  } catch (const Error& e) {
    throw Error(call.source.where + ": " + e.what(), ErrorKind::kUsage);
  }
}

const OptionsSchema<InferenceOptions>& inference_schema() {
  using O = InferenceOptions;
  static const auto schema = OptionsSchema<O>()
                                 .add("finalize_qat", &O::finalize_qat, "turn conv_bn_qat nodes into folded layers")
                                 .add("repvgg", &O::repvgg, "merge RepVGG blocks into single 3×3 convs")
                                 .add("fold", &O::fold, "fold BN into the conv / linear layer before it")
                                 .add("threshold", &O::threshold, "turn BN + sign binarizer into thresholds")
                                 .include(selection_schema<O>());
  return schema;
}

}  // namespace

// The fuse passes in the pass registry (graph/pass_registry.h).
void register_passes() {
  register_pass(make_pass("fold_batchnorm", "fuse",
                          "folds a batch_norm into the conv2d / conv_transpose2d / linear before it: W·γ/σ, β + (b − μ)·γ/σ",
                          selection_schema<FoldOptions>(),
                          [](Graph& g, const FoldOptions& o, const PassCall& call) {
    check_selection(g, o, call);
    return fold_batchnorm(g, o).summary();
  }));
  register_pass(make_pass(
      "repvgg", "fuse", "RepVGG re-parameterization (Ding et al. 2021): 3×3 + 1×1 + identity branches with BN → one 3×3 conv",
      selection_schema<RepvggOptions>(),
      [](Graph& g, const RepvggOptions& o, const PassCall& call) {
    check_selection(g, o, call);
    return reparameterize_repvgg(g, o).summary();
  }));
  register_pass(make_pass(
      "bn_threshold", "fuse", "batch_norm + sign binarizer → threshold_sign (per-channel threshold and sign flip, FINN-style)",
      selection_schema<ThresholdOptions>(),
      [](Graph& g, const ThresholdOptions& o, const PassCall& call) {
    check_selection(g, o, call);
    return fold_bn_into_threshold(g, o).summary();
  }));
  register_pass(make_pass(
      "qat_batchnorm", "fuse", "layer + BN → conv_bn_qat for QAT with the folded weight (Jacob et al. 2018); bn_fold joins the stack",
      selection_schema<QatOptions>(),
      [](Graph& g, const QatOptions& o, const PassCall& call) {
    check_selection(g, o, call);
    return prepare_qat_batchnorm(g, o).summary();
  }));
  static const OptionsSchema<NoOptions> none;
  register_pass(make_pass("qat_batchnorm_finalize", "fuse", "conv_bn_qat → its base layer with the folded weight and bias", none,
                          [](Graph& g, const NoOptions&, const PassCall&) { return finalize_qat_batchnorm(g).summary(); }));
  register_pass(make_pass("fuse_for_inference", "fuse",
                          "the inference pipeline: finalize QAT folding, RepVGG, BN folding, BN → threshold", inference_schema(),
                          [](Graph& g, const InferenceOptions& o, const PassCall& call) {
    check_selection(g, o, call);
    return fuse_for_inference(g, o).summary();
  }));
}

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_threshold_op();
    detail::register_qat();
    register_passes();
  });
}

WHITTLE_REGISTER_MODULE("fuse", &register_all)

void Report::append(const Report& other) {
  const std::string prefix = other.pass.empty() || other.pass == pass ? "" : other.pass + ": ";
  for (const auto& f : other.fused) fused.push_back(prefix + f);
  for (const auto& s : other.skipped) skipped.push_back(prefix + s);
}

std::string Report::summary() const {
  std::ostringstream os;
  os << (pass.empty() ? "fuse" : pass) << ": " << fused.size() << " rewrite" << (fused.size() == 1 ? "" : "s") << ", "
     << skipped.size() << " skipped\n";
  for (const auto& f : fused) os << "  fused   " << f << "\n";
  for (const auto& s : skipped) os << "  skipped " << s << "\n";
  return os.str();
}

Report fuse_for_inference(Graph& graph, const InferenceOptions& o) {
  register_all();
  // Node names are checked once, against the graph as given; an earlier pass may remove a named
  // node (a folded BN), which the later passes then no longer look for.
  (void)select_nodes(graph, o.targets, o.ignore);
  auto still_there = [&graph](const std::vector<std::string>& patterns) {
    std::vector<std::string> kept;
    for (const auto& p : patterns)
      if (p.rfind("re:", 0) == 0 || has_op(p) || graph.find_node(p)) kept.push_back(p);
    return kept;
  };
  struct Patterns {
    std::vector<std::string> targets, ignore;
  };
  auto options = [&]() -> std::optional<Patterns> {
    const std::vector<std::string> targets = still_there(o.targets);
    if (!o.targets.empty() && targets.empty()) return std::nullopt;  // every named target is gone
    return Patterns{targets, still_there(o.ignore)};
  };
  Report all;
  all.pass = "fuse";
  if (o.finalize_qat) all.append(finalize_qat_batchnorm(graph));
  if (o.repvgg)
    if (auto s = options()) all.append(reparameterize_repvgg(graph, {s->targets, s->ignore}));
  if (o.fold)
    if (auto s = options()) all.append(fold_batchnorm(graph, {s->targets, s->ignore}));
  if (o.threshold)
    if (auto s = options()) all.append(fold_bn_into_threshold(graph, {s->targets, s->ignore}));
  return all;
}

Report fuse_for_inference(GraphModule& module, const InferenceOptions& options) {
  return run_on_module(module, "fuse_for_inference", ModuleMode::kEval, [&](Graph& g) { return fuse_for_inference(g, options); });
}

int64_t count_foldable_batchnorm(const Graph& graph) {
  int64_t count = 0;
  for (const Node& n : graph.nodes()) {
    std::string layer;
    if (n.op == "batch_norm" && detail::layer_bn_problem(graph, n, &layer).empty()) ++count;
  }
  return count;
}

}  // namespace whittle::fuse
