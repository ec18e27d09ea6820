// CPU eval latency of a model pruned to half its MACs (L1, per-group ratio found by the MACs
// target, physical removal) against the unpruned model, for ResNet-20, ResNet-56, MobileNetV2 and
// VGG-Small (CIFAR variants, 32×32 inputs) at batch 1 and 32, next to the MACs ratio. Both are
// BN-folded first (the deploy form). Eval mode, no autograd, LibTorch's default intra-op threads
// (OMP_NUM_THREADS pins them). Counters: macs (per image), params. Figures: docs/performance.md.
//
//   ./bench/bench_prune --benchmark_min_time=2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <map>
#include <string>

#include "fuse/fuse.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "prune/prune.h"

namespace {

// One model, pruned (kept widths a multiple of round_to) or not, kept across the repetitions.
whittle::GraphModule& model(const std::string& name, bool pruned, int64_t round_to) {
  static std::map<std::string, whittle::GraphModule> cache;
  const std::string key = name + (pruned ? ":pruned" + std::to_string(round_to) : ":dense");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  whittle::ZooOptions zo;
  zo.seed = 0;
  whittle::GraphModule m(whittle::build_model(name, zo));
  m->eval();
  if (pruned) {
    whittle::prune::Config c;
    c.target_macs = 0.5;
    c.round_to = round_to;
    whittle::prune::prune(m, c);
  }
  whittle::fuse::fuse_for_inference(m);
  return cache.emplace(key, m).first->second;
}

void BM_Eval(benchmark::State& state, const std::string& name, bool pruned, int64_t round_to) {
  const int64_t batch = state.range(0);
  whittle::GraphModule& m = model(name, pruned, round_to);
  at::manual_seed(0);
  const at::Tensor x = at::randn({batch, 3, 32, 32});
  at::NoGradGuard no_grad;
  for (int i = 0; i < 2; ++i) benchmark::DoNotOptimize(m->forward(x));  // warm-up
  for (auto _ : state) {
    at::Tensor y = m->forward(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const whittle::NodeCost cost = whittle::graph_cost(m->graph());
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["macs"] = static_cast<double>(cost.macs);
  state.counters["params"] = static_cast<double>(cost.params);
}

#define WHITTLE_PRUNE_BENCH(model_name)                                                                        \
  BENCHMARK_CAPTURE(BM_Eval, model_name##_dense, #model_name, false, 1)->Arg(1)->Arg(32)->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_Eval, model_name##_pruned, #model_name, true, 1)->Arg(1)->Arg(32)->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_Eval, model_name##_pruned_round8, #model_name, true, 8)->Arg(1)->Arg(32)->Unit(benchmark::kMillisecond)

WHITTLE_PRUNE_BENCH(resnet20);
WHITTLE_PRUNE_BENCH(resnet56);
WHITTLE_PRUNE_BENCH(mobilenet_v2);
WHITTLE_PRUNE_BENCH(vgg_small);

}  // namespace

BENCHMARK_MAIN();
