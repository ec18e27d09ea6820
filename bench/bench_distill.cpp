// Distillation cost: one training step (forward, backward, SGD step) of a ResNet-20 student on a
// CIFAR-sized batch, plain (cross-entropy) against distilled from a same-size ResNet-20 teacher
// (its eval-mode no-grad forward added, then α·KD + (1 − α)·CE; BM_Step/1), and with attention
// transfer on the three stage outputs as well (BM_Step/2). The ratio of a distilled step to the
// plain one is the distillation overhead (at most 1.3× with KD; docs/performance.md).
//   ./bench/bench_distill --benchmark_min_time=2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// WHITTLE_BENCH_BATCH overrides the batch size (default 128).

#include <benchmark/benchmark.h>
#include <torch/optim/sgd.h>

#include <cstdlib>

#include "distill/distill.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"

namespace {

void BM_Step(benchmark::State& state) {
  const int64_t mode = state.range(0);  // 0 plain, 1 KD, 2 KD + attention
  state.SetLabel(mode == 0 ? "plain" : mode == 1 ? "kd" : "kd+attention");
  const char* env = std::getenv("WHITTLE_BENCH_BATCH");
  const int64_t batch = env ? std::atoll(env) : 128;
  at::manual_seed(0);
  whittle::GraphModule student(whittle::build_model("resnet20"));
  whittle::ZooOptions zo;
  zo.seed = 1;
  whittle::distill::Teacher teacher(whittle::build_model("resnet20", zo));
  student->train();
  torch::optim::SGD opt(student->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const at::Tensor x = at::randn({batch, 3, 32, 32});
  const at::Tensor y = at::randint(0, 10, {batch});
  const std::vector<std::string> stages{"layer1.2.relu2", "layer2.2.relu2", "layer3.2.relu2"};
  auto step = [&] {
    at::Tensor loss;
    if (mode == 0) {
      loss = at::cross_entropy_loss(student->forward(x), y);
    } else {
      std::map<std::string, at::Tensor> sf, tf;
      const std::vector<std::string> capture = mode == 2 ? stages : std::vector<std::string>{};
      const at::Tensor t = teacher.forward(x, capture, &tf);
      const at::Tensor s = mode == 2 ? student->forward_with_intermediates({x}, capture, &sf).at(0) : student->forward(x);
      loss = whittle::distill::kd_mixed_loss(s, t, y, 4.0, 0.9);
      for (const auto& v : capture) loss = loss + whittle::distill::attention_loss(sf.at(v), tf.at(v));
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 2; ++i) step();  // warm-up
  for (auto _ : state) step();
  state.SetItemsProcessed(state.iterations() * batch);
}

BENCHMARK(BM_Step)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
