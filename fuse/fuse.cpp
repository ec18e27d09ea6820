#include "fuse/fuse.h"

#include <ATen/ATen.h>

#include <mutex>
#include <sstream>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "core/error.h"
#include "graph/op_registry.h"

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

}  // namespace

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_threshold_op();
    detail::register_qat();
  });
}

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
  Report all;
  all.pass = "fuse";
  if (o.finalize_qat) all.append(finalize_qat_batchnorm(graph));
  if (o.repvgg) all.append(reparameterize_repvgg(graph, {o.targets, o.ignore}));
  if (o.fold) all.append(fold_batchnorm(graph, {o.targets, o.ignore}));
  if (o.threshold) all.append(fold_bn_into_threshold(graph, {o.targets, o.ignore}));
  return all;
}

Report fuse_for_inference(GraphModule& module, const InferenceOptions& options) {
  if (module->is_training())
    throw Error("fuse_for_inference: the module is in training mode; fusion uses the running statistics that eval() "
                "uses (never batch statistics), so call module->eval() first");
  Report r = fuse_for_inference(module->graph(), options);
  module->sync();
  return r;
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
