// Bitpacked kernels against ATen's float convolution of the same shape, per instruction set and
// thread count, and the popcount throughput limit they are held to.
//
//   BM_PopcountLimit/<isa>   the microkernel on an L1-resident 4 × 32 block with K = 64 words:
//                            the most words a core counts per second with that instruction set
//                            (one thread), the limit the convolution is compared with.
//   BM_BinaryConv3x3/<isa>/T a binary 3×3 convolution, 256 → 256 channels on 28×28, padding 1,
//                            batch 1, float output with the α scale (kernels/binary_conv.h),
//                            input already packed; T intra-op threads.
//   BM_PackSigns/T           packing that input's signs (what a binary layer adds before the kernel).
//   BM_FloatConv3x3/T        at::conv2d of the same shape in float (oneDNN where LibTorch has it).
//   BM_BitplaneConv3x3/<isa>/c<C>/T   a W2A2 bit-plane 3×3 convolution (kernels/bitplane.h), C → C
//                            channels on 28×28, against BM_FloatConvChannels/c<C>/T (and
//                            BM_FloatConv3x3 for C = 256).
//   BM_CudaBinaryConv3x3/N, BM_CudaPackSigns/N, BM_CudaFloatConv3x3/{float,half}/N
//                            the same layer at batch N on a CUDA GPU against cuDNN (skipped without one).
// Counters: words_per_second (popcount words), binary MACs as items (C·kh·kw per output). The
// figures and ratios are in docs/kernels.md (summary in docs/performance.md).
//
//   ./bench/bench_kernels --benchmark_min_time=1 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>

#include <vector>

#include "kernels/binary_conv.h"
#include "kernels/bitpack.h"
#include "kernels/bitplane.h"
#include "kernels/isa.h"
#include "kernels/popcount_gemm.h"

namespace {

using whittle::kernels::Isa;
constexpr int64_t kC = 256, kO = 256, kH = 28, kW = 28;
constexpr double kMacs = double(kO) * kH * kW * kC * 9;
constexpr double kWords = double(kO) * kH * kW * 9 * (kC / 64);

void BM_PopcountLimit(benchmark::State& state, Isa isa) {
  if (!whittle::kernels::isa_supported(isa)) return state.SkipWithError("not supported on this CPU");
  whittle::kernels::set_isa(isa);
  // The microkernel at its best block shape (4 rows × 32 columns, K = 64 words), all in L1: no
  // memory traffic, no tails, only XOR + popcount + add.
  constexpr int64_t M = 4, N = 32, K = 64;
  std::vector<uint64_t> a(M * K), b(K * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = i * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < b.size(); ++i) b[i] = ~(i * 0xC2B2AE3D27D4EB4Full) >> 3;
  int32_t c[M * N];
  const auto gemm = whittle::kernels::detail::popcount_gemm();
  for (auto _ : state) {
    gemm(whittle::kernels::detail::BitOp::kXor, a.data(), K, b.data(), N, M, N, K, c, N);
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  state.counters["words_per_second"] = benchmark::Counter(double(state.iterations()) * M * N * K, benchmark::Counter::kIsRate);
}

struct ConvInputs {
  at::Tensor x, w, packed_x;
  whittle::kernels::PackedBinaryWeight pw;
  at::Tensor alpha;
};

const ConvInputs& inputs() {
  static ConvInputs in = [] {
    at::manual_seed(0);
    ConvInputs c;
    c.x = at::where(at::randn({1, kC, kH, kW}) >= 0, 1.0f, -1.0f);
    c.w = at::randn({kO, kC, 3, 3});
    c.packed_x = whittle::kernels::pack_signs(c.x);
    c.pw = whittle::kernels::pack_binary_weight(c.w);
    c.alpha = c.w.abs().mean({1, 2, 3});
    return c;
  }();
  return in;
}

void BM_BinaryConv3x3(benchmark::State& state, Isa isa) {
  if (!whittle::kernels::isa_supported(isa)) return state.SkipWithError("not supported on this CPU");
  whittle::kernels::set_isa(isa);
  at::set_num_threads(static_cast<int>(state.range(0)));
  const ConvInputs& in = inputs();
  for (auto _ : state) {
    at::Tensor y = whittle::kernels::binary_conv2d(in.packed_x, in.pw, {1, 1, 1, 1}, {in.alpha, {}, {}, {}});
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kMacs));
  state.counters["words_per_second"] = benchmark::Counter(double(state.iterations()) * kWords, benchmark::Counter::kIsRate);
}

void BM_PackSigns(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  const ConvInputs& in = inputs();
  for (auto _ : state) {
    at::Tensor p = whittle::kernels::pack_signs(in.x);
    benchmark::DoNotOptimize(p.data_ptr());
  }
}

// W2A2 bit-plane convolution of the same shape (2 weight × 2 activation planes: DoReFa 2-bit
// weights and activations), input planes already packed; against it, BM_FloatConv3x3 (the same
// float convolution whatever the values).
void BM_BitplaneConv3x3(benchmark::State& state, Isa isa, int64_t channels) {
  if (!whittle::kernels::isa_supported(isa)) return state.SkipWithError("not supported on this CPU");
  whittle::kernels::set_isa(isa);
  at::set_num_threads(static_cast<int>(state.range(0)));
  at::manual_seed(0);
  const at::Tensor codes = at::randint(0, 4, {1, channels, kH, kW}, at::kLong).to(at::kFloat);
  const at::Tensor wc = at::randint(0, 4, {channels, channels, 3, 3}, at::kLong);
  const auto w = whittle::kernels::pack_bitplane_weight(
      {wc.bitwise_and(1).to(at::kFloat), wc.bitwise_right_shift(1).to(at::kFloat)}, {2.0 / 3, 4.0 / 3}, -1.0);
  const at::Tensor planes = whittle::kernels::pack_bitplanes(codes, 2);
  for (auto _ : state) {
    at::Tensor y = whittle::kernels::bitplane_conv2d(planes, w, {1, 1, 1, 1}, {});
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * double(channels) * kH * kW * channels * 9));
}

// The float convolution of a channels → channels 3×3 layer on 28×28 (the reference of BM_BitplaneConv3x3).
void BM_FloatConvChannels(benchmark::State& state, int64_t channels) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, channels, kH, kW}), w = at::randn({channels, channels, 3, 3});
  at::NoGradGuard no_grad;
  for (auto _ : state) {
    at::Tensor y = at::conv2d(x, w, {}, 1, 1);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * double(channels) * kH * kW * channels * 9));
}

void BM_FloatConv3x3(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  const ConvInputs& in = inputs();
  at::Tensor wq = in.w.sign();
  at::NoGradGuard no_grad;
  for (auto _ : state) {
    at::Tensor y = at::conv2d(in.x, wq, {}, 1, 1);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kMacs));
}

// ---- on a CUDA GPU (skipped without one): the same 256 → 256 3×3 layer on 28×28 at batch N
// (the argument), whittle's binary kernel (packed input and weight on the GPU, float output with the
// α scale; and pack_signs) against cuDNN's float and half convolutions of the same shape through
// ATen. Each iteration synchronizes the device, so the time is the kernel's end to end.
bool cuda_ready(benchmark::State& state) {
  if (torch::cuda::is_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

void BM_CudaBinaryConv3x3(benchmark::State& state) {
  if (!cuda_ready(state)) return;
  const at::Device gpu(at::kCUDA, 0);
  at::manual_seed(0);
  const int64_t N = state.range(0);
  const at::Tensor x = whittle::kernels::pack_signs(at::randn({N, kC, kH, kW}, at::TensorOptions().device(gpu)));
  const auto pw = whittle::kernels::pack_binary_weight(at::randn({kO, kC, 3, 3})).to(gpu);
  const at::Tensor alpha = (at::rand({kO}) + 0.5).to(gpu), bias = at::zeros({kO}, at::TensorOptions().device(gpu));
  for (auto _ : state) {
    at::Tensor y = whittle::kernels::binary_conv2d(x, pw, {1, 1, 1, 1}, {alpha, bias, {}, {}});
    torch::cuda::synchronize();
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kMacs * double(N)));
}

void BM_CudaPackSigns(benchmark::State& state) {
  if (!cuda_ready(state)) return;
  const at::Tensor x = at::randn({state.range(0), kC, kH, kW}, at::TensorOptions().device(at::kCUDA));
  for (auto _ : state) {
    at::Tensor p = whittle::kernels::pack_signs(x);
    torch::cuda::synchronize();
    benchmark::DoNotOptimize(p.data_ptr());
  }
}

void BM_CudaFloatConv3x3(benchmark::State& state, at::ScalarType dtype) {
  if (!cuda_ready(state)) return;
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  at::globalContext().setAllowTF32CuDNN(false);  // float: IEEE float32 multiply-adds, not TF32
  const at::Tensor x = at::randn({state.range(0), kC, kH, kW}, options), w = at::randn({kO, kC, 3, 3}, options).sign();
  at::NoGradGuard no_grad;
  for (auto _ : state) {
    at::Tensor y = at::conv2d(x, w, {}, 1, 1);
    torch::cuda::synchronize();
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kMacs * double(state.range(0))));
}

BENCHMARK(BM_CudaBinaryConv3x3)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CudaPackSigns)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaFloatConv3x3, float, at::kFloat)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaFloatConv3x3, half, at::kHalf)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_PopcountLimit, scalar, Isa::kScalar);
BENCHMARK_CAPTURE(BM_PopcountLimit, avx2, Isa::kAvx2);
BENCHMARK_CAPTURE(BM_PopcountLimit, avx512, Isa::kAvx512);
BENCHMARK_CAPTURE(BM_BinaryConv3x3, scalar, Isa::kScalar)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BinaryConv3x3, avx2, Isa::kAvx2)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BinaryConv3x3, avx512, Isa::kAvx512)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackSigns)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FloatConv3x3)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BitplaneConv3x3, avx512/c64, Isa::kAvx512, 64)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BitplaneConv3x3, avx512/c128, Isa::kAvx512, 128)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BitplaneConv3x3, avx512/c256, Isa::kAvx512, 256)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BitplaneConv3x3, avx2/c256, Isa::kAvx2, 256)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FloatConvChannels, c64, 64)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FloatConvChannels, c128, 128)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
