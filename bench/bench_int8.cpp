// int8 convolutions of ResNet-20's shapes: whittle's int8 kernels (kernels/int8_conv.h, each
// variant this CPU runs) against LibTorch's quantized engine (fbgemm, prepacked weight) and ATen's
// float convolution (oneDNN, channels-last), on uint8 codes in channels-last memory, requantized
// to uint8 (whittle, fbgemm) or float output (ATen).
//
//   BM_Int8Conv/<variant>/<shape>/N/T   whittle's kernel, N images, T intra-op threads
//   BM_FbgemmConv/<shape>/N/T           quantized::conv2d through its prepacked parameters
//   BM_FloatConv/<shape>/N/T            at::conv2d in float
//   BM_Int8Add/<variant>/N/T, BM_QuantizedAdd/N/T   a residual addition of 16 × 32 × 32 maps
// <shape>: st 3→16 on 32×32 (the stem), s1 16→16 on 32×32, s2 32→32 on 16×16, s3 64→64 on 8×8 (3×3, padding 1), t2 16→32 on
// 32×32 with stride 2. Counter: MACs per second (items). Figures in docs/performance.md.
//
//   ./bench/bench_int8 --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/quantized/PackedParams.h>
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kernels/int8_conv.h"

namespace {

using whittle::kernels::Int8Variant;

struct ConvShape {
  const char* name;
  int64_t C, O, H, k, stride, pad;
};
const ConvShape kShapes[] = {{"st", 3, 16, 32, 3, 1, 1}, {"s1", 16, 16, 32, 3, 1, 1}, {"s2", 32, 32, 16, 3, 1, 1}, {"s3", 64, 64, 8, 3, 1, 1},
                             {"t2", 16, 32, 32, 3, 2, 1}};

double macs(const ConvShape& s, int64_t N) {
  const int64_t OH = (s.H + 2 * s.pad - s.k) / s.stride + 1;
  return double(N) * OH * OH * s.O * s.C * s.k * s.k;
}

void BM_Int8Conv(benchmark::State& state, Int8Variant v, ConvShape s) {
  if (!whittle::kernels::int8_variant_supported(v)) return state.SkipWithError("not supported on this CPU");
  const int64_t N = state.range(0);
  at::set_num_threads(static_cast<int>(state.range(1)));
  const at::Tensor x = at::randint(0, 256, {N, s.H, s.H, s.C}, at::kByte);
  const at::Tensor w = at::randint(-127, 128, {s.O, s.C, s.k, s.k}, at::kChar);
  const std::vector<float> w_scale(s.O, 0.01f), bias(s.O, 0.1f);
  whittle::kernels::Int8ConvShape shape;
  shape.in_channels = s.C;
  shape.out_channels = s.O;
  shape.kernel_h = shape.kernel_w = s.k;
  shape.stride_h = shape.stride_w = s.stride;
  shape.pad_h = shape.pad_w = s.pad;
  const whittle::kernels::Int8Conv2d conv(shape, w.data_ptr<int8_t>(), w_scale.data(), bias.data(), v);
  std::vector<uint8_t> y(N * shape.out_h(s.H) * shape.out_w(s.H) * s.O);
  const auto requantization = conv.requantization(0.02f, 100, 0.05f, 3, true);  // once, as the deploy runtime
  for (auto _ : state) {
    conv.run(x.data_ptr<uint8_t>(), N, s.H, s.H, requantization, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * macs(s, N)));
}

void BM_FbgemmConv(benchmark::State& state, ConvShape s) {
  const int64_t N = state.range(0);
  at::set_num_threads(static_cast<int>(state.range(1)));
  const at::Tensor x = at::quantize_per_tensor(at::rand({N, s.C, s.H, s.H}).contiguous(at::MemoryFormat::ChannelsLast),
                                               0.02, 100, at::kQUInt8);
  const at::Tensor w = at::_make_per_channel_quantized_tensor(at::randint(-127, 128, {s.O, s.C, s.k, s.k}, at::kChar),
                                                              at::full({s.O}, 0.01, at::kDouble),
                                                              at::zeros({s.O}, at::kLong), 0);
  std::vector<c10::IValue> stack = {w,
                                    at::full({s.O}, 0.1f),
                                    std::vector<int64_t>{s.stride, s.stride},
                                    std::vector<int64_t>{s.pad, s.pad},
                                    std::vector<int64_t>{1, 1},
                                    int64_t{1}};
  c10::Dispatcher::singleton().findSchemaOrThrow("quantized::conv2d_prepack", "").callBoxed(&stack);
  const auto packed = stack.at(0).toCustomClass<ConvPackedParamsBase<2>>();
  for (auto _ : state) {
    at::Tensor y = packed->apply_relu(x, 0.05, 3);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * macs(s, N)));
}

void BM_FloatConv(benchmark::State& state, ConvShape s) {
  const int64_t N = state.range(0);
  at::set_num_threads(static_cast<int>(state.range(1)));
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({N, s.C, s.H, s.H}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor w = at::randn({s.O, s.C, s.k, s.k}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor b = at::randn({s.O});
  for (auto _ : state) {
    at::Tensor y = at::relu(at::conv2d(x, w, b, s.stride, s.pad));
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * macs(s, N)));
}

void BM_Int8Add(benchmark::State& state, Int8Variant v) {
  if (!whittle::kernels::int8_variant_supported(v)) return state.SkipWithError("not supported on this CPU");
  const int64_t n = state.range(0) * 16 * 32 * 32;
  at::set_num_threads(static_cast<int>(state.range(1)));
  const at::Tensor a = at::randint(0, 256, {n}, at::kByte), b = at::randint(0, 256, {n}, at::kByte);
  std::vector<uint8_t> y(n);
  for (auto _ : state) {
    whittle::kernels::int8_add(a.data_ptr<uint8_t>(), 0.05f, 10, b.data_ptr<uint8_t>(), 0.04f, 100, y.data(), 0.06f, 5,
                               true, n, v);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_QuantizedAdd(benchmark::State& state) {
  const int64_t N = state.range(0);
  at::set_num_threads(static_cast<int>(state.range(1)));
  const auto shape = std::vector<int64_t>{N, 16, 32, 32};
  const at::Tensor a = at::quantize_per_tensor(at::rand(shape).contiguous(at::MemoryFormat::ChannelsLast), 0.05, 10, at::kQUInt8);
  const at::Tensor b = at::quantize_per_tensor(at::rand(shape).contiguous(at::MemoryFormat::ChannelsLast), 0.04, 100, at::kQUInt8);
  static const auto add_relu = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("quantized::add_relu", "")
                                   .typed<at::Tensor(at::Tensor, at::Tensor, double, int64_t)>();
  for (auto _ : state) {
    at::Tensor y = add_relu.call(a, b, 0.06, 5);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * a.numel());
}

void register_all() {
  const std::vector<std::vector<int64_t>> args = {{1, 1}, {1, 2}, {32, 1}, {32, 2}};
  auto apply_args = [&](benchmark::internal::Benchmark* b) {
    for (const auto& a : args) b->Args(a);
    b->ArgNames({"N", "T"})->UseRealTime();
  };
  for (const ConvShape& s : kShapes) {
    for (Int8Variant v : {Int8Variant::kAvx512Vnni, Int8Variant::kAvx2, Int8Variant::kScalar}) {
      if (v == Int8Variant::kScalar) continue;  // minutes at batch 32; kernels_test checks it
      apply_args(benchmark::RegisterBenchmark(
          ("BM_Int8Conv/" + whittle::kernels::int8_variant_name(v) + "/" + s.name).c_str(), BM_Int8Conv, v, s));
    }
    apply_args(benchmark::RegisterBenchmark((std::string("BM_FbgemmConv/") + s.name).c_str(), BM_FbgemmConv, s));
    apply_args(benchmark::RegisterBenchmark((std::string("BM_FloatConv/") + s.name).c_str(), BM_FloatConv, s));
  }
  for (Int8Variant v : {Int8Variant::kAvx512Vnni, Int8Variant::kAvx2})
    apply_args(benchmark::RegisterBenchmark(("BM_Int8Add/" + whittle::kernels::int8_variant_name(v)).c_str(), BM_Int8Add, v));
  apply_args(benchmark::RegisterBenchmark("BM_QuantizedAdd", BM_QuantizedAdd));
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
