// CPU inference latency before and after fusion (fuse::fuse_for_inference: RepVGG merging and BN
// folding) for ResNet-20, MobileNetV2 and RepVGG-A0 (CIFAR variants, 32×32 inputs) at batch 1 and
// 32. Eval mode, no autograd, LibTorch's default intra-op threads (set OMP_NUM_THREADS to pin).
// Items are images, so items_per_second is images/s. Figures: docs/performance.md.
//
//   ./bench/bench_fuse --benchmark_min_time=2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <map>
#include <string>

#include "fuse/fuse.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"

namespace {

// One model, fused or not, kept across the benchmark's repetitions.
whittle::GraphModule& model(const std::string& name, bool fused) {
  static std::map<std::string, whittle::GraphModule> cache;
  const std::string key = name + (fused ? ":fused" : ":plain");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  whittle::ZooOptions zo;
  zo.seed = 0;
  whittle::GraphModule m(whittle::build_model(name, zo));
  m->eval();
  if (fused) whittle::fuse::fuse_for_inference(m);
  return cache.emplace(key, m).first->second;
}

void BM_Inference(benchmark::State& state, const std::string& name, bool fused) {
  const int64_t batch = state.range(0);
  whittle::GraphModule& m = model(name, fused);
  at::manual_seed(0);
  const at::Tensor x = at::randn({batch, 3, 32, 32});
  at::NoGradGuard no_grad;
  for (int i = 0; i < 2; ++i) benchmark::DoNotOptimize(m->forward(x));  // warm-up
  for (auto _ : state) {
    at::Tensor y = m->forward(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["nodes"] = static_cast<double>(m->graph().nodes().size());
}

#define WHITTLE_FUSE_BENCH(model_name)                                                                      \
  BENCHMARK_CAPTURE(BM_Inference, model_name##_unfused, #model_name, false)->Arg(1)->Arg(32)->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_Inference, model_name##_fused, #model_name, true)->Arg(1)->Arg(32)->Unit(benchmark::kMillisecond)

WHITTLE_FUSE_BENCH(resnet20);
WHITTLE_FUSE_BENCH(mobilenet_v2);
WHITTLE_FUSE_BENCH(repvgg_a0);

}  // namespace

BENCHMARK_MAIN();
