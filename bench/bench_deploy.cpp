// Whole binary models: the deploy runtime (deploy::Model, binary layers on the bitpacked kernels)
// against the float execution of the same fused model through ATen (deploy::Options{false}: every
// node's forward, oneDNN for the convolutions), per model, batch and thread count.
//
//   BM_Model/<model>/<runtime>/<batch>/<threads>
//     model:   lenet5_bnn (LeNet-5 BNN on [N, 1, 28, 28]), resnet20_bnn and resnet20_xnor
//              ([N, 3, 32, 32]): the zoo models quantized as the recipes do (first and last
//              layers in float), BN statistics randomized, weights random (speed does not depend
//              on them)
//     runtime: deploy | float
// Counter: images per second. Figures in docs/performance.md and docs/kernels.md.
//
//   ./bench/bench_deploy --benchmark_min_time=1 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>

#include "deploy/model.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"

namespace {

using whittle::Graph;

Graph binary_model(const std::string& zoo_name, const std::string& method, const whittle::Shape& input) {
  whittle::ZooOptions zo;
  zo.input_shape = input;
  zo.seed = 1;
  Graph g = whittle::build_model(zoo_name, zo);
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  for (auto& n : g.nodes()) {
    if (n.op != "batch_norm") continue;
    const int64_t c = n.buffers.at("running_mean").size(0);
    n.buffers.at("running_mean").copy_(at::randn({c}) * 0.2);
    n.buffers.at("running_var").copy_(at::rand({c}) + 0.5);
  }
  whittle::quantize::Config c;
  c.method = method;
  whittle::quantize::apply(g, c);
  return g;
}

// Built once per (model, runtime).
const whittle::deploy::Model& model(const std::string& name, bool kernels) {
  static std::map<std::string, std::unique_ptr<whittle::deploy::Model>> cache;
  const std::string key = name + (kernels ? "/deploy" : "/float");
  auto& slot = cache[key];
  if (!slot) {
    Graph g = name == "lenet5_bnn"      ? binary_model("lenet5", "bnn", {1, 1, 28, 28})
              : name == "resnet20_bnn"  ? binary_model("resnet20", "bnn", {1, 3, 32, 32})
                                        : binary_model("resnet20", "xnor", {1, 3, 32, 32});
    slot = std::make_unique<whittle::deploy::Model>(g, whittle::deploy::Options{kernels});
  }
  return *slot;
}

void BM_Model(benchmark::State& state, const std::string& name, bool kernels) {
  const int64_t batch = state.range(0);
  at::set_num_threads(static_cast<int>(state.range(1)));
  const auto& m = model(name, kernels);
  whittle::Shape shape = m.graph().value(m.graph().inputs().front()).shape;
  shape[0] = batch;
  at::manual_seed(0);
  const at::Tensor x = at::randn(shape);
  for (auto _ : state) {
    at::Tensor y = m.forward(x);
    benchmark::DoNotOptimize(y.data_ptr<float>());
  }
  state.counters["images_per_second"] =
      benchmark::Counter(double(state.iterations()) * double(batch), benchmark::Counter::kIsRate);
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "threads"});
  for (int64_t batch : {1, 16})
    for (int64_t threads : {1, 2}) b->Args({batch, threads});
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(BM_Model, lenet5_bnn/deploy, std::string("lenet5_bnn"), true)->Apply(args);
BENCHMARK_CAPTURE(BM_Model, lenet5_bnn/float, std::string("lenet5_bnn"), false)->Apply(args);
BENCHMARK_CAPTURE(BM_Model, resnet20_bnn/deploy, std::string("resnet20_bnn"), true)->Apply(args);
BENCHMARK_CAPTURE(BM_Model, resnet20_bnn/float, std::string("resnet20_bnn"), false)->Apply(args);
BENCHMARK_CAPTURE(BM_Model, resnet20_xnor/deploy, std::string("resnet20_xnor"), true)->Apply(args);
BENCHMARK_CAPTURE(BM_Model, resnet20_xnor/float, std::string("resnet20_xnor"), false)->Apply(args);

BENCHMARK_MAIN();
