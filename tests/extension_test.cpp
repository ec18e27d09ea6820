// The extension points, used from this file alone: a toy quantizer method (a 3-level uniform grid
// with a learned step) and a toy export format are registered here, through the one registration
// entry point, and then work everywhere the shipped ones do: the quantize pass and the recipe's
// quantize modifier, the optimizer (the learned step is trained, without weight decay), packed
// checkpoints (reloaded bitwise), ONNX (int8 weight codes into DequantizeLinear) and
// TorchScript (bitwise equal), the recipe's outputs.export with the exporter's own option key, and
// `whittle inspect`'s registry listings. A toy pass runs through the pass registry with typed
// options. No file outside this one knows any of these entries.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/file_util.h"
#include "core/registry.h"
#include "export/checkpoint.h"
#include "export/exporter.h"
#include "export/onnx.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "graph/zoo.h"
#include "prune/prune.h"
#include "quantize/method.h"
#include "recipe_support.h"
#include "runner/trainer.h"
#include "support.h"

namespace whittle {
namespace {

// ---- the toy method: weights s·clamp(round(w/s), −1, 1) with a learned step s per tensor

// The grid value with a straight-through gradient: ∂/∂w = 1 inside [−s, s], 0 outside; ∂/∂s =
// round(w/s) − w/s inside, ±1 outside (LSQ's step gradient without its scale g).
at::Tensor toy3_weight(const at::Tensor& w, const at::Tensor& s) {
  const at::Tensor c = at::clamp(w / s, -1.0, 1.0);
  // c + (round(c) − c) is round(c) exactly: the difference is exact for |c| ≤ 1 (Sterbenz).
  return (c + (at::round(c) - c).detach()) * s;
}

class Toy3Method final : public quantize::QuantizerMethod {
 public:
  std::string name() const override { return "toy3"; }
  std::string description() const override { return "test: 3-level uniform weight grid with a learned step"; }
  std::string weight_bits_text() const override { return "2"; }
  std::string activation_bits_text() const override { return "32"; }
  quantize::Config resolve(const quantize::Config& in) const override {
    quantize::Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 2;
    if (c.activation_bits == 0) c.activation_bits = 32;
    if (c.weight_bits != 2) quantize::bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (c.activation_bits != 32) quantize::bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    if (!c.options.empty()) throw Error("quantize: method 'toy3' has no options", ErrorKind::kUsage);
    return c;
  }
  std::string weight_quantizer(const quantize::Config&) const override { return "toy3"; }
  void attach_weight(Node& n, const quantize::Config&) const override {
    n.attrs["weight_bits"] = int64_t{2};
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    const at::Tensor w = n.params.at("weight").detach();
    n.params.set("toy_step", (2.0 * w.abs().mean()).reshape({1}).clone().set_requires_grad(true));
  }
  std::optional<quantize::ActivationPlan> activations(const quantize::Config&) const override { return std::nullopt; }
  std::string label(const quantize::Config&) const override { return "toy3"; }
};

void register_toy_method() {
  quantize::WeightQuantizer q;
  q.name = "toy3";
  q.description = "test: s·clamp(round(w/s), -1, 1), learned s";
  q.attributes = quantize::weight_quantizer_attributes(2, 2);
  q.params = {"toy_step"};
  q.forward = [](const Node& n, const at::Tensor& w, bool) { return toy3_weight(w, n.params.at("toy_step")); };
  // Codes c + 1 ∈ {0, 1, 2} with scale s: the ternary encoding s·(code − 1) decodes them bitwise.
  q.encode = [](const Node& n, const at::Tensor& w) {
    at::NoGradGuard no_grad;
    const at::Tensor s = n.params.at("toy_step").detach();
    quantize::EncodedWeight e;
    e.codes = at::round(at::clamp(w.detach() / s, -1.0, 1.0)) + 1;
    e.scale = s.to(at::kFloat).reshape({1});
    e.encoding = quantize::Encoding::kTernary;
    e.bits = 2;
    e.axis = n.attr_int("weight_axis");
    return e;
  };
  q.integer_grid = [](const quantize::EncodedWeight& e, const Shape& shape) -> std::optional<quantize::IntegerGrid> {
    const int64_t channels = shape.at(static_cast<size_t>(e.axis));
    return quantize::IntegerGrid{e.scale.to(at::kFloat).reshape({1}).expand({channels}).contiguous(), e.axis};
  };
  quantize::register_weight_quantizer(std::move(q));
  quantize::register_quantizer_method(std::make_unique<Toy3Method>());
}

// ---- the toy exporter: one line per node, "<name> <op>", under a header line

struct ToyTextOptions {
  std::string header = "whittle graph";  ///< the first line
};

const OptionsSchema<ToyTextOptions>& toy_text_schema() {
  static const auto s = OptionsSchema<ToyTextOptions>().add("header", &ToyTextOptions::header, "first line of the file");
  return s;
}

class ToyTextExporter final : public Exporter {
 public:
  std::string name() const override { return "toytext"; }
  std::string description() const override { return "test: the node list as text"; }
  std::vector<std::string> extensions() const override { return {".toytxt"}; }
  std::vector<KeySpec> option_keys() const override { return toy_text_schema().keys(); }
  void check(const Graph&, const Settings& options) const override { toy_text_schema().parse(options, "toytext"); }
  void write(const Graph& graph, const std::string& path, const Settings& options, const ExportInfo&) const override {
    std::string text = toy_text_schema().parse(options, "toytext").header + "\n";
    for (const Node& n : graph.nodes()) text += n.name + " " + n.op + "\n";
    write_file_atomic(path, text);
  }
  std::string summary(const Settings&) const override { return "toy text"; }
  std::string verify(const std::string& path, const CheckData*) const override {
    if (read_file(path).empty()) throw Error("verify " + path + ": empty");
    return path + " is not empty";
  }
};

// ---- the toy pass: every targeted linear layer's weight times `factor`

struct ToyScaleOptions {
  double factor = 2.0;               ///< the weights' multiplier
  std::vector<std::string> targets;  ///< linear layers to scale (default: all)
};

const OptionsSchema<ToyScaleOptions>& toy_scale_schema() {
  static const auto s = OptionsSchema<ToyScaleOptions>()
                            .add("factor", &ToyScaleOptions::factor, "multiplier of the weights")
                            .in_range(Range::above(0))
                            .add("targets", &ToyScaleOptions::targets, "linear layers to scale");
  return s;
}

void register_toys() {
  register_toy_method();
  register_exporter(std::make_unique<ToyTextExporter>());
  register_pass(make_pass("toy_scale", "extension_test", "test: linear weights times a factor", toy_scale_schema(),
                          [](Graph& g, const ToyScaleOptions& o, const PassCall&) {
                            int scaled = 0;
                            for (const Node& n : g.nodes()) {
                              if (n.op != "linear" ||
                                  (!o.targets.empty() && std::find(o.targets.begin(), o.targets.end(), n.name) == o.targets.end()))
                                continue;
                              g.node(n.name).params.set("weight", n.params.at("weight") * o.factor);
                              ++scaled;
                            }
                            return "scaled " + std::to_string(scaled) + " layers";
                          }));
}

WHITTLE_REGISTER_MODULE("extension_test", &register_toys)

Graph lenet5() {
  ZooOptions o;
  o.seed = 3;
  return build_model("lenet5", o);
}

// The method through the pass: its weight quantizer and learned step on the chosen layers, trained
// by an optimizer (the step moves), the step is a quantizer parameter (no weight decay), the
// packed checkpoint reloads bitwise, and both exporters write it (TorchScript bitwise equal, ONNX
// with the int8 grid).
TEST(ExtensionPoints, ToyMethodTrainsPacksReloadsAndExports) {
  GraphModule m(lenet5());
  quantize::Config c;
  c.method = "toy3";
  const quantize::Report r = quantize::apply(m, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"conv2", "fc1", "fc2"}));
  const Node& conv2 = m->graph().node("conv2");
  EXPECT_EQ(conv2.weight_transforms, std::vector<std::string>{"toy3"});
  EXPECT_EQ(param_role(conv2, "toy_step"), ParamRole::kQuantizer);
  EXPECT_EQ(param_role(conv2, "weight"), ParamRole::kWeight);
  const at::Tensor step0 = conv2.params.at("toy_step").detach().clone();

  // Two SGD steps on random digits: the step is a module parameter and learns.
  std::vector<at::Tensor> params;
  for (const auto& p : m->parameters()) params.push_back(p);
  bool has_step = false;
  for (const auto& kv : m->named_parameters()) has_step |= kv.key() == "conv2.toy_step";
  ASSERT_TRUE(has_step);
  at::manual_seed(0);
  for (int step = 0; step < 2; ++step) {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    const at::Tensor loss = m->forward(at::randn({8, 1, 28, 28})).logsumexp(1).mean();
    loss.backward();
    at::NoGradGuard no_grad;
    for (auto& p : params)
      if (p.grad().defined()) p.sub_(0.1 * p.grad());
  }
  EXPECT_FALSE(at::equal(m->graph().node("conv2").params.at("toy_step").detach(), step0));

  // Packed checkpoint: codes and the step as scale; reloads to bitwise the same eval outputs.
  m->eval();
  const at::Tensor x = at::randn({4, 1, 28, 28});
  const at::Tensor y = m->forward(x).detach();
  const std::string dir = test::fresh_dir("extension_toy_method");
  make_directories(dir);
  const std::string path = join_path(dir, "toy.h5");
  save_checkpoint(path, m->graph());
  const Checkpoint loaded = load_checkpoint(path);
  const Node& packed = loaded.graph.node("conv2");
  EXPECT_EQ(packed.weight_transforms, std::vector<std::string>{"packed"});
  EXPECT_EQ(packed.attr_str("quant_method"), "toy3");
  EXPECT_FALSE(packed.params.contains("toy_step"));
  EXPECT_FALSE(packed.params.contains("weight"));
  GraphModule reloaded(loaded.graph.clone());
  reloaded->eval();
  EXPECT_TRUE(at::equal(reloaded->forward(x), y));

  // TorchScript: bitwise equal outputs; ONNX: the weight as int8 codes into DequantizeLinear.
  const std::string ts = join_path(dir, "toy.pt");
  exporter("torchscript").write(m->graph(), ts, {}, {});
  const CheckData data = make_check_data(m->graph());
  EXPECT_NE(exporter("torchscript").verify(ts, &data).find("bitwise equal"), std::string::npos);
  const std::string bytes = onnx_model_bytes(loaded.graph);
  EXPECT_NE(bytes.find("conv2/weight_dequantize"), std::string::npos);
  EXPECT_NE(bytes.find("conv2.weight_quantized"), std::string::npos);
  EXPECT_NE(bytes.find("conv2.weight_scale"), std::string::npos);
}

// The method named in a recipe: the quantize modifier finds it in the registry, trains two steps
// and writes a packed checkpoint naming it; a setting it does not have is refused, naming it.
TEST(ExtensionPoints, ToyMethodRunsFromARecipe) {
  const std::string dir = test::fresh_dir("extension_toy_recipe");
  runner::Recipe recipe = test::lenet5_quick_recipe(1, "  - {name: quantize, method: toy3}\n");
  recipe.data.train_limit = 64;  // 2 optimizer steps of 32 images
  std::ostringstream log;
  runner::RunOptions o;
  o.out_dir = dir;
  o.log = &log;
  const runner::RunResult res = runner::run_recipe(recipe, o);
  EXPECT_EQ(res.epochs_done, 1) << log.str();
  const Checkpoint c = load_checkpoint(join_path(dir, "model.h5"));
  EXPECT_EQ(c.graph.node("conv2").attr_str("quant_method"), "toy3");
  EXPECT_EQ(c.graph.node("fc1").attr_str("quant_method"), "toy3");

  // dorefa's activation_clip is a key of the modifier, but not of toy3: refused before any work.
  const std::string msg = test::usage_error_message([&] {
    runner::RunOptions again = o;
    again.out_dir = test::fresh_dir("extension_toy_recipe_refused");
    runner::run_recipe(test::lenet5_quick_recipe(1, "  - {name: quantize, method: toy3, activation_clip: 2}\n"), again);
  });
  EXPECT_NE(msg.find("activation_clip applies to method dorefa, twn, not toy3"), std::string::npos) << msg;
  EXPECT_FALSE(path_exists(join_path(test::binary_dir(), "testdata/extension_toy_recipe_refused/model.h5")));
}

// The exporter named in a recipe's outputs.export, with its own option key outputs.toytext_header,
// and found by extension; an option of another format is refused naming the format it belongs to.
TEST(ExtensionPoints, ToyExporterFromARecipeAndByExtension) {
  const std::string dir = test::fresh_dir("extension_toy_exporter");
  const std::string mnist = join_path(test::source_dir(), "data/mnist10k");
  const runner::Recipe recipe = runner::parse_recipe(
      "model: {name: lenet5}\n"
      "data: {train: " + mnist + ", test: " + mnist +
          ", test_split: t10k, batch_size: 32, train_limit: 32, test_limit: 32, num_workers: 0}\n"
          "training: {epochs: 1, threads: 1}\n"
          "outputs: {export: [toytext], toytext_header: hello}\n",
      "r.yaml", test::source_dir());
  std::ostringstream log;
  runner::RunOptions o;
  o.out_dir = dir;
  o.log = &log;
  runner::run_recipe(recipe, o);
  const std::string text = read_file(join_path(dir, "model.toytxt"));
  EXPECT_EQ(text.rfind("hello\nconv1 conv2d\n", 0), 0u) << text;

  ASSERT_NE(exporter_for_path("a/b.toytxt"), nullptr);
  EXPECT_EQ(exporter_for_path("a/b.toytxt")->name(), "toytext");
  EXPECT_EQ(exporter_for_path("a/b.onnx")->name(), "onnx");
  EXPECT_EQ(exporter_for_path("a/b.unknown"), nullptr);
  Settings s;
  s["opset"] = int64_t{13};
  const std::string msg = test::usage_error_message([&] { check_export_options(exporter("toytext"), s, "export"); });
  EXPECT_NE(msg.find("opset applies to format onnx only"), std::string::npos) << msg;
}

// Every kind of entry is listed by the one registry index, the toys among them.
TEST(ExtensionPoints, RegistriesListEveryKind) {
  std::vector<std::string> plurals;
  for (const RegistryBase* r : all_registries()) plurals.push_back(r->plural());
  for (const char* p : {"ops", "transforms", "passes", "modifiers", "methods", "weight-quantizers",
                        "activation-quantizers", "exporters"})
    EXPECT_NE(std::find(plurals.begin(), plurals.end(), p), plurals.end()) << p;
  EXPECT_TRUE(find_registry("methods")->contains("toy3"));
  EXPECT_TRUE(find_registry("methods")->contains("dorefa"));
  EXPECT_TRUE(find_registry("exporters")->contains("toytext"));
  EXPECT_TRUE(find_registry("transforms")->contains("toy3"));
  EXPECT_EQ(find_registry("exporters")->description("toytext"), "test: the node list as text");
  try {
    find_registry("exporters")->description("nope");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown exporter 'nope' (known exporters: "), std::string::npos) << e.what();
  }
}

// A pass registered from this file runs through the registry: typed options with their defaults,
// errors naming the key as the caller spells it (a recipe key or a command's flag).
TEST(ExtensionPoints, ToyPassRunsThroughTheRegistry) {
  const PassInfo& p = pass_info("toy_scale");
  ASSERT_EQ(p.options.size(), 2u);
  EXPECT_EQ(p.options[0].name, "factor");
  EXPECT_EQ(p.options[0].default_text, "2");
  Graph g = lenet5();
  const at::Tensor fc1 = g.node("fc1").params.at("weight").clone(), fc2 = g.node("fc2").params.at("weight").clone();
  EXPECT_EQ(run_pass("toy_scale", g), "scaled 3 layers");  // the default factor, every linear layer
  EXPECT_TRUE(at::equal(g.node("fc1").params.at("weight"), fc1 * 2.0));
  Settings s;
  s["factor"] = 0.5;
  s["targets"] = std::vector<std::string>{"fc2"};
  EXPECT_EQ(run_pass("toy_scale", g, s), "scaled 1 layers");
  EXPECT_TRUE(at::equal(g.node("fc2").params.at("weight"), fc2 * 2.0 * 0.5));
  EXPECT_TRUE(at::equal(g.node("fc1").params.at("weight"), fc1 * 2.0));
  auto message = [&](const Settings& bad, const OptionSource& source) {
    try {
      run_pass("toy_scale", g, PassCall{bad, source});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Settings zero;
  zero["factor"] = 0.0;
  EXPECT_EQ(message(zero, {"pass 'toy_scale'"}), "pass 'toy_scale', key 'factor': 0 is outside > 0");
  EXPECT_EQ(message(zero, {"toy", KeyStyle::kFlag}), "toy: --factor: 0 is outside > 0");
  Settings unknown;
  unknown["scale"] = 1.0;
  EXPECT_EQ(message(unknown, {"toy", KeyStyle::kFlag}), "toy: unknown option --scale");
  EXPECT_TRUE(at::equal(g.node("fc1").params.at("weight"), fc1 * 2.0)) << "a refused call changes nothing";
}

// The shipped passes through the registry: `prune` gives what make_plan + remove_channels give,
// and its checks across keys name the keys as the caller spells them.
TEST(ExtensionPoints, PrunePassThroughTheRegistry) {
  Graph by_registry = lenet5(), direct = lenet5();
  Settings s;
  s["target_macs"] = 0.5;
  s["group_reduction"] = std::string("mean");
  run_pass("prune", by_registry, s);
  prune::Config c;
  c.target_macs = 0.5;
  c.scoring.mean_over_members = true;
  prune::remove_channels(direct, prune::make_plan(direct, c));
  for (const Node& n : direct.nodes())
    for (const auto& [name, t] : n.params)
      EXPECT_TRUE(at::equal(by_registry.node(n.name).params.at(name), t)) << n.name << "." << name;
  Settings two = s;
  two["sparsity"] = 0.3;
  Graph g = lenet5();
  try {
    run_pass("prune", g, PassCall{two, {"prune", KeyStyle::kFlag}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "prune: give one of --sparsity, --target-macs and --target-params");
  }
  Settings taylor;
  taylor["criterion"] = std::string("taylor");
  try {
    run_pass("prune", g, taylor);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "pass 'prune', key 'criterion': 'taylor' needs gradients from training; use the recipe modifier 'prune'");
  }
  // A prune that would remove nothing is refused with each group's reason (issue 47, item 6).
  Settings nothing;
  nothing["round_to"] = int64_t{1000};
  try {
    run_pass("prune", g, nothing);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(e.what(), "pass 'prune': nothing would be removed: group 0: fixed: graph input 'input'; group 5 (fc3): fixed: "
                           "graph output 'fc3'; 4 group(s) keep every channel with these amounts (key 'round_to' 1000, "
                           "key 'min_channels' 1)");
  }
}

}  // namespace
}  // namespace whittle
