// Quantization-aware training cost: one training step (forward, backward, SGD step) of ResNet-20
// on a CIFAR-sized batch of 128, FP32 against each quantization method, on the CPU
// (BM_TrainStep/<method>) and on the first CUDA device (BM_TrainStepCuda/<method>, reported as
// skipped without one). The ratio of a method's time to FP32's is the QAT overhead (DoReFa W4A4
// should stay within 1.3×). Methods: 0 fp32, 1 dorefa_w8a8, 2 dorefa_w4a4, 3 dorefa_w2a2, 4 twn,
// 5 bnn, 6 xnor.
//   ./bench/bench_qat --benchmark_counters_tabular=true
// WHITTLE_BENCH_BATCH overrides the batch size (e.g. 32 for a quick look).

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>

#include <cstdlib>

#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"

namespace {

struct Method {
  const char* name;
  const char* method;  // "" = FP32
  int64_t weight_bits, activation_bits;
};

const Method kMethods[] = {{"fp32", "", 32, 32},       {"dorefa_w8a8", "dorefa", 8, 8}, {"dorefa_w4a4", "dorefa", 4, 4},
                           {"dorefa_w2a2", "dorefa", 2, 2}, {"twn", "twn", 2, 32},        {"bnn", "bnn", 1, 1},
                           {"xnor", "xnor", 1, 1}};

void train_step(benchmark::State& state, const at::Device& device) {
  const Method& m = kMethods[state.range(0)];
  state.SetLabel(m.name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const char* env = std::getenv("WHITTLE_BENCH_BATCH");
  const int64_t batch = env ? std::atoll(env) : 128;
  at::manual_seed(0);
  whittle::GraphModule model(whittle::build_model("resnet20"));
  if (*m.method) {
    whittle::quantize::Config c;
    c.method = m.method;
    c.weight_bits = m.weight_bits;
    c.activation_bits = m.activation_bits;
    whittle::quantize::apply(model, c);
  }
  model->to(device);
  model->train();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  at::Tensor x = at::randn({batch, 3, 32, 32}).to(device);
  at::Tensor y = at::randint(0, 10, {batch}).to(device);
  auto step = [&] {
    at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    whittle::quantize::clip_latent_weights(model->graph());
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  step();  // warm-up (allocator, thread pool, cuDNN algorithm choice)
  for (auto _ : state) step();
  state.counters["images_per_s"] = benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TrainStep(benchmark::State& state) { train_step(state, at::Device(at::kCPU)); }
void BM_TrainStepCuda(benchmark::State& state) { train_step(state, at::Device(at::kCUDA, 0)); }

}  // namespace

BENCHMARK(BM_TrainStep)->DenseRange(0, 6)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_TrainStepCuda)->DenseRange(0, 6)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

BENCHMARK_MAIN();
