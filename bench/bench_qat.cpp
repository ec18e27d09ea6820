// Quantization-aware training cost on the CPU (and the first CUDA device, reported as skipped
// without one).
//
// BM_TrainStep/<model>/<method>/<fused>/<checkpointing>: one training step (forward, backward, SGD step, latent
// weight clipping) at batch 128, FP32 against each quantization method, with the fused quantizer
// kernels (quantize/fused_quantizers.h; fused = 1) and with the ATen-op quantizers they replace
// (fused = 0). Models: 0 ResNet-20, 1 NIN (CIFAR-sized input). Methods: 0 fp32, 1 dorefa_w8a8,
// 2 dorefa_w4a4, 3 dorefa_w2a2, 4 twn, 5 bnn, 6 xnor, 7 lsq_w4a4, 8 lsq_w2a2, 9 pact_w4a4,
// 10 lsq_plus_w4a4 (the learned steps and clips at their values before any data). Counters: images_per_s, and peak_MiB, the
// most tensor memory the step holds above what was alive before it (bench/peak_memory.h: the
// activations saved for the backward, the gradients, the temporaries). checkpointing = 1 runs
// with activation checkpointing (GraphModule::set_checkpoint_segments): ResNet-20's nine blocks,
// NIN's conv units, recomputed in the backward (FP32, DoReFa W4A4 and BNN).
//
// BM_OptimizerStep/<model>/<kind>: the SGD step alone (momentum 0.9, Nesterov, weight decay 5e-4)
// over the model's parameters: 0 torch::optim::SGD (a loop of ATen ops per parameter), 1 ATen's
// fused SGD kernel (at::_fused_sgd_) over the parameter list, 2 the fused kernel over the
// parameters kept in one contiguous buffer (with the gradients and momentum in one buffer each).
//
// The QAT/FP32 ratios, as docs/performance.md gives them (median of 5 repetitions, randomly
// interleaved so that a slow minute of the machine does not fall on one method):
//   .venv/bin/python bench/qat_ratio.py --build build
// or by hand:
//   build/bench/bench_qat --benchmark_filter=BM_TrainStep/ --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true (one line)
// WHITTLE_BENCH_BATCH overrides the batch size (e.g. 32 for a quick look).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <string>

#include "bench/peak_memory.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"

namespace {

struct Method {
  const char* name;
  const char* method;  // "" = FP32
  int64_t weight_bits, activation_bits;
};

const Method kMethods[] = {{"fp32", "", 32, 32},       {"dorefa_w8a8", "dorefa", 8, 8}, {"dorefa_w4a4", "dorefa", 4, 4},
                           {"dorefa_w2a2", "dorefa", 2, 2}, {"twn", "twn", 2, 32},        {"bnn", "bnn", 1, 1},
                           {"xnor", "xnor", 1, 1},          {"lsq_w4a4", "lsq", 4, 4},       {"lsq_w2a2", "lsq", 2, 2},
                           {"pact_w4a4", "pact", 4, 4},     {"lsq_plus_w4a4", "lsq_plus", 4, 4}};
constexpr int64_t kMethodCount = static_cast<int64_t>(sizeof(kMethods) / sizeof(kMethods[0]));
const char* const kModels[] = {"resnet20", "nin"};

int64_t batch_size() {
  const char* env = std::getenv("WHITTLE_BENCH_BATCH");
  return env ? std::atoll(env) : 128;
}

// The config of `m` ("" method: none, FP32).
whittle::quantize::Config config_of(const Method& m) {
  whittle::quantize::Config c;
  c.method = m.method;
  c.weight_bits = m.weight_bits;
  c.activation_bits = m.activation_bits;
  return c;
}

whittle::GraphModule make_model(int64_t model, const Method& m) {
  at::manual_seed(0);
  whittle::GraphModule g(whittle::build_model(kModels[model]));
  if (*m.method) whittle::quantize::apply(g, config_of(m));
  return g;
}

void train_step(benchmark::State& state, const at::Device& device) {
  const int64_t model_index = state.range(0);
  const Method& m = kMethods[state.range(1)];
  const bool fused = state.range(2) != 0;
  const bool checkpointing = state.range(3) != 0;
  state.SetLabel(std::string(kModels[model_index]) + " " + m.name + (fused ? "" : " aten-op quantizers") +
                 (checkpointing ? " checkpointed" : ""));
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto& memory = whittle::bench::PeakMemory::install();
  whittle::quantize::set_fused_quantizers(fused);
  const int64_t batch = batch_size();
  whittle::GraphModule model = make_model(model_index, m);
  if (checkpointing)
    model->set_checkpoint_segments(model_index == 0 ? std::vector<std::string>{"layer1.0", "layer1.1", "layer1.2", "layer2.0",
                                                                               "layer2.1", "layer2.2", "layer3.0", "layer3.1",
                                                                               "layer3.2"}
                                                    : std::vector<std::string>{"model.0", "model.1", "model.2", "model.4",
                                                                               "model.5", "model.6", "model.8", "model.9"});
  model->to(device);
  model->train();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const whittle::quantize::Config resolved = *m.method ? whittle::quantize::resolve(config_of(m)) : config_of(m);
  at::Tensor x = at::randn({batch, 3, 32, 32}).to(device);
  at::Tensor y = at::randint(0, 10, {batch}).to(device);
  auto step = [&] {
    at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (*m.method) whittle::quantize::after_step(model->graph(), resolved);
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  step();  // warm-up (allocator, thread pool, cuDNN algorithm choice, the momentum buffers)
  const size_t before = memory.live();
  memory.reset_peak();
  for (auto _ : state) step();
  whittle::quantize::set_fused_quantizers(true);
  state.counters["images_per_s"] = benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  if (!device.is_cuda())
    state.counters["peak_MiB"] = static_cast<double>(memory.peak() - before) / (1024.0 * 1024.0);
}

void BM_TrainStep(benchmark::State& state) { train_step(state, at::Device(at::kCPU)); }
void BM_TrainStepCuda(benchmark::State& state) { train_step(state, at::Device(at::kCUDA, 0)); }

// Every model × method with the fused kernels, the quantized methods without them too, and FP32,
// W4A4 and BNN checkpointed.
void train_step_args(benchmark::internal::Benchmark* b) {
  for (int64_t model = 0; model < 2; ++model)
    for (int64_t method = 0; method < kMethodCount; ++method) {
      b->Args({model, method, 1, 0});
      if (method > 0) b->Args({model, method, 0, 0});
      if (method == 0 || method == 2 || method == 5) b->Args({model, method, 1, 1});
    }
}

void BM_OptimizerStep(benchmark::State& state) {
  const int64_t model_index = state.range(0);
  const int64_t kind = state.range(1);
  static const char* const kKinds[] = {"torch::optim::SGD", "fused SGD, parameter list", "fused SGD, one buffer"};
  state.SetLabel(std::string(kModels[model_index]) + " " + kKinds[kind]);
  const double lr = 0.01, momentum = 0.9, weight_decay = 5e-4;
  whittle::GraphModule model = make_model(model_index, kMethods[0]);
  std::vector<at::Tensor> params = model->parameters();
  int64_t count = 0;
  for (auto& p : params) {
    p.mutable_grad() = at::randn_like(p);
    count += p.numel();
  }
  if (kind == 0) {
    torch::optim::SGD opt(params, torch::optim::SGDOptions(lr).momentum(momentum).nesterov(true).weight_decay(weight_decay));
    opt.step();  // creates the momentum buffers
    for (auto _ : state) opt.step();
  } else if (kind == 1) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> p, g, buf;
    for (auto& t : params) {
      p.push_back(t.detach());
      g.push_back(t.grad());
      buf.push_back(at::zeros_like(t));
    }
    for (auto _ : state)
      at::_fused_sgd_(p, g, buf, weight_decay, momentum, lr, /*dampening=*/0.0, /*nesterov=*/true, /*maximize=*/false,
                      /*is_first_step=*/false);
  } else {
    at::NoGradGuard no_grad;
    at::Tensor p = at::randn({count}), g = at::randn({count}), buf = at::zeros({count});
    for (auto _ : state)
      at::_fused_sgd_({p}, {g}, {buf}, weight_decay, momentum, lr, 0.0, true, false, false);
  }
  state.counters["parameters"] = static_cast<double>(count);
  state.counters["tensors"] = static_cast<double>(params.size());
}

}  // namespace

BENCHMARK(BM_TrainStep)->Apply(train_step_args)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_TrainStepCuda)->Apply(train_step_args)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_OptimizerStep)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
