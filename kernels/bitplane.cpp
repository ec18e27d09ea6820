#include "kernels/bitplane.h"

#include <ATen/ATen.h>

#include <atomic>
#include <vector>

#include "core/error.h"
#include "kernels/bitpack.h"
#include "kernels/cuda_ops.h"
#include "kernels/im2col.h"
#include "core/parallel.h"
#include "kernels/popcount_gemm.h"

namespace whittle::kernels {
namespace {

using detail::sizes_of;

constexpr int64_t kMinWordsPerTask = 1 << 16;  // as binary_conv.cpp: about 10 µs of popcounts

const uint64_t* words_of(const at::Tensor& t) { return reinterpret_cast<const uint64_t*>(t.data_ptr<int64_t>()); }

// Population count without a POPCNT instruction (this unit is built for any x86-64): the
// SWAR sum of bit pairs, nibbles and bytes, which the compiler vectorizes over a row of words.
inline int64_t popcount64(uint64_t v) {
  v = v - ((v >> 1) & 0x5555555555555555ull);
  v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
  v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<int64_t>((v * 0x0101010101010101ull) >> 56);
}

// The epilogue's scale and bias as float [O] (1 and 0 where undefined).
struct ScaleBias {
  at::Tensor scale, bias;
  ScaleBias(const BinaryEpilogue& e, int64_t O, const char* who, const at::Device& device) {
    if (e.threshold.defined() || e.direction.defined())
      throw Error(std::string(who) + ": the bit-plane kernels write float outputs only (no threshold epilogue)");
    auto vec = [&](const at::Tensor& t, float fill, const char* name) {
      if (!t.defined()) return at::full({O}, fill, at::TensorOptions().dtype(at::kFloat).device(device));
      if (t.dim() != 1 || t.size(0) != O)
        throw Error(std::string(who) + ": epilogue " + name + " has shape " + sizes_of(t) + ", expected [" +
                    std::to_string(O) + "]");
      return t.to(device, at::kFloat).contiguous();
    };
    scale = vec(e.scale, 1.0f, "scale");
    bias = vec(e.bias, 0.0f, "bias");
  }
};

void check_weight(const PackedBitplaneWeight& w, const char* who) {
  if (w.planes.empty() || w.planes.size() != w.coefficients.size() || w.planes.size() > 8)
    throw Error(std::string(who) + ": the weight has " + std::to_string(w.planes.size()) + " planes and " +
                std::to_string(w.coefficients.size()) +
                " coefficients (pack_bitplane_weight makes it: one coefficient a plane, 1 to 8 planes)");
  for (const auto& p : w.planes)
    if (p.out_channels != w.out_channels || p.in_channels != w.in_channels || p.kernel_h != w.kernel_h ||
        p.kernel_w != w.kernel_w || !p.words.defined())
      throw Error(std::string(who) + ": the weight's planes disagree in shape (pack_bitplane_weight makes it)");
}

void check_planes(const at::Tensor& x, int64_t rank, const PackedBitplaneWeight& w, const char* who) {
  const int64_t Cw = words_for(w.in_channels);
  detail::check_kernel_device(x, who);
  if (!x.defined() || x.scalar_type() != at::kLong || x.dim() != rank + 1 || x.size(0) < 1 || x.size(-1) != Cw)
    throw Error(std::string(who) + ": expected activation planes int64 " + (rank == 4 ? "[P, N, H, W, " : "[P, N, ") +
                std::to_string(Cw) + "] for " + std::to_string(w.in_channels) + " input channels, got " +
                (x.defined() ? std::string(c10::toString(x.scalar_type())) + " " + sizes_of(x) + " on " + x.device().str()
                             : "undefined"));
  if (x.size(0) > 8)
    throw Error(std::string(who) + ": " + std::to_string(x.size(0)) + " activation planes (pack_bitplanes makes 1..8)");
  for (const auto& p : w.planes)
    if (p.words.device() != x.device())
      throw Error(std::string(who) + ": the activation planes are on " + x.device().str() + " and a weight plane on " +
                  p.words.device().str() + " (PackedBitplaneWeight::to moves a weight)");
  const double most = double(w.in_channels) * double(w.kernel_h * w.kernel_w) * double((int64_t{1} << x.size(0)) - 1);
  if (most >= double(1u << 31))
    throw Error(std::string(who) + ": " + std::to_string(x.size(0)) + " activation planes over " +
                std::to_string(w.in_channels * w.kernel_h * w.kernel_w) + " weights per output overflow the int32 sums");
}

}  // namespace

PackedBitplaneWeight PackedBitplaneWeight::to(const at::Device& device) const {
  PackedBitplaneWeight w = *this;
  for (auto& p : w.planes) p = p.to(device);
  return w;
}

PackedBitplaneWeight pack_bitplane_weight(const std::vector<at::Tensor>& planes, const std::vector<double>& coefficients,
                                          double offset) {
  if (planes.empty() || planes.size() != coefficients.size() || planes.size() > 8)
    throw Error("pack_bitplane_weight: " + std::to_string(planes.size()) + " planes and " +
                std::to_string(coefficients.size()) + " coefficients (one coefficient per plane, 1 to 8 planes)");
  PackedBitplaneWeight w;
  w.coefficients = coefficients;
  w.offset = offset;
  for (const at::Tensor& p : planes) {
    if (!p.defined() || p.sizes() != planes.front().sizes())
      throw Error("pack_bitplane_weight: every plane needs the shape " + sizes_of(planes.front()) + ", got " +
                  (p.defined() ? sizes_of(p) : std::string("undefined")));
    // pack_binary_weight sets the bit of negative values: −1 where the plane is 1.
    w.planes.push_back(pack_binary_weight(at::where(p != 0, -at::ones_like(p), at::ones_like(p))));
  }
  const PackedBinaryWeight& f = w.planes.front();
  w.out_channels = f.out_channels;
  w.in_channels = f.in_channels;
  w.kernel_h = f.kernel_h;
  w.kernel_w = f.kernel_w;
  return w;
}

at::Tensor pack_bitplanes(const at::Tensor& codes, int64_t bits) {
  if (bits < 1 || bits > 8) throw Error("pack_bitplanes: bits must be 1..8, got " + std::to_string(bits));
  detail::check_kernel_device(codes, "pack_bitplanes");
  if (!codes.defined() || (codes.dim() != 2 && codes.dim() != 4))
    throw Error("pack_bitplanes: expected codes [N, C, H, W] or [N, C], got " +
                (codes.defined() ? sizes_of(codes) + " on " + codes.device().str() : std::string("undefined")));
#ifdef WHITTLE_WITH_CUDA
  if (codes.is_cuda()) return detail::cuda::pack_bitplanes(codes, bits);
#endif
  // Codes below 2^8 are exact in float: one read of each code, in NCHW order, sets its bits in
  // every plane (as pack_signs does for one plane).
  const at::Tensor src_t = codes.to(at::kFloat).contiguous();
  const int64_t N = codes.size(0), C = codes.size(1), HW = codes.dim() == 4 ? codes.size(2) * codes.size(3) : 1;
  const int64_t words = words_for(C);
  std::vector<int64_t> shape{bits, N};
  if (codes.dim() == 4) shape.insert(shape.end(), {codes.size(2), codes.size(3)});
  shape.push_back(words);
  at::Tensor out = at::zeros(shape, at::kLong);
  const float* src = src_t.data_ptr<float>();
  auto* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  const int64_t plane_words = N * HW * words, top = int64_t{1} << bits;
  std::atomic<bool> bad{false};
  constexpr int64_t kBlock = 1024;
  const int64_t blocks = (HW + kBlock - 1) / kBlock;
  whittle::parallel_for(0, N * blocks, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, C * std::min(HW, kBlock))),
                       [&](int64_t begin, int64_t end) {
    bool local_bad = false;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / blocks, p0 = (t % blocks) * kBlock, p1 = std::min(HW, p0 + kBlock);
      uint64_t* w = dst + n * HW * words;
      for (int64_t c = 0; c < C; ++c) {
        const float* v = src + (n * C + c) * HW;
        const int64_t k = c / 64, b = c % 64;
        for (int64_t p = p0; p < p1; ++p) {
          const float f = v[p];
          const bool in_range = f >= 0.0f && f < static_cast<float>(top);  // false for NaN
          const int64_t code = in_range ? static_cast<int64_t>(f) : 0;
          local_bad |= !in_range || f != static_cast<float>(code);
          for (int64_t j = 0; j < bits; ++j)
            w[j * plane_words + p * words + k] |= static_cast<uint64_t>((code >> j) & 1) << b;
        }
      }
    }
    if (local_bad) bad = true;
  });
  if (bad)
    throw Error("pack_bitplanes: every code must be an integer in [0, " + std::to_string(top) + "), got values in [" +
                std::to_string(src_t.min().item<double>()) + ", " + std::to_string(src_t.max().item<double>()) + "]");
  return out;
}

at::Tensor bitplane_conv2d(const at::Tensor& activation_planes, const PackedBitplaneWeight& w,
                           const BinaryConv2dOptions& opt, const BinaryEpilogue& epilogue) {
  const char* who = "bitplane_conv2d";
  check_weight(w, who);
  check_planes(activation_planes, 4, w, who);
  const ScaleBias sb(epilogue, w.out_channels, who, activation_planes.device());
  const at::Tensor x = activation_planes.contiguous();
  const int64_t P = x.size(0), N = x.size(1), H = x.size(2), W = x.size(3), Cw = x.size(4);
  const int64_t O = w.out_channels, KH = w.kernel_h, KW = w.kernel_w, K = KH * KW * Cw;
  const int64_t Ho = conv_output_size(H, KH, opt.stride_h, opt.pad_h);
  const int64_t Wo = conv_output_size(W, KW, opt.stride_w, opt.pad_w);
#ifdef WHITTLE_WITH_CUDA
  if (x.is_cuda())
    return detail::cuda::bitplane_conv(x, w, detail::conv_shape(N, H, W, w.planes.front(), opt, Ho, Wo), sb.scale, sb.bias);
#endif
  const int64_t Pw = static_cast<int64_t>(w.planes.size()), plane_words = N * H * W * Cw;
  at::Tensor out = at::empty({N, O, Ho, Wo}, at::kFloat);
  float* y = out.data_ptr<float>();
  const float* scale = sb.scale.data_ptr<float>();
  const float* bias = sb.bias.data_ptr<float>();
  const uint64_t* xin = words_of(x);
  std::vector<const uint64_t*> wts;
  for (const auto& p : w.planes) wts.push_back(words_of(p.words));
  const detail::PopcountGemmFn gemm = detail::popcount_gemm();
  const int64_t row_words = std::max<int64_t>(1, Wo * O * K * P * Pw);
  whittle::parallel_for(0, N * Ho, std::max<int64_t>(1, kMinWordsPerTask / row_words), [&](int64_t begin, int64_t end) {
    detail::RowInput input(H, W, Cw, KH, KW, opt, Wo);
    std::vector<int32_t> pop(static_cast<size_t>(Wo * O)), acc(static_cast<size_t>(Pw * Wo * O));
    std::vector<int64_t> ones(static_cast<size_t>(Wo));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / Ho, oh = r % Ho;
      std::fill(acc.begin(), acc.end(), 0);
      std::fill(ones.begin(), ones.end(), 0);
      for (int64_t j = 0; j < P; ++j) {
        const uint64_t* a = input.row(xin + j * plane_words, n, oh);
        // Σ_j 2^j·popcount(a_j) over each position's window: the offset's term.
        for (int64_t ow = 0; ow < Wo; ++ow) {
          int64_t c = 0;
          for (int64_t k = 0; k < K; ++k) c += popcount64(a[ow * K + k]);
          ones[ow] += c << j;
        }
        for (int64_t i = 0; i < Pw; ++i) {
          gemm(detail::BitOp::kAnd, a, K, wts[i], O, Wo, O, K, pop.data(), O);
          int32_t* acc_i = acc.data() + i * Wo * O;
          for (int64_t t = 0; t < Wo * O; ++t) acc_i[t] += pop[t] << j;
        }
      }
      const int64_t plane = Ho * Wo;
      for (int64_t o = 0; o < O; ++o) {
        float* dst = y + (n * O + o) * plane + oh * Wo;
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double v = w.offset * static_cast<double>(ones[ow]);
          for (int64_t i = 0; i < Pw; ++i) v += w.coefficients[i] * acc[(i * Wo + ow) * O + o];
          dst[ow] = static_cast<float>(v) * scale[o] + bias[o];
        }
      }
    }
  });
  return out;
}

at::Tensor bitplane_linear(const at::Tensor& activation_planes, const PackedBitplaneWeight& w,
                           const BinaryEpilogue& epilogue) {
  const char* who = "bitplane_linear";
  check_weight(w, who);
  if (w.kernel_h != 1 || w.kernel_w != 1)
    throw Error(std::string(who) + ": the weight is a " + std::to_string(w.kernel_h) + "×" + std::to_string(w.kernel_w) +
                " convolution's, expected a linear layer's [O, C]");
  check_planes(activation_planes, 2, w, who);
  const ScaleBias sb(epilogue, w.out_channels, who, activation_planes.device());
  const at::Tensor x = activation_planes.contiguous();
  const int64_t P = x.size(0), N = x.size(1), Cw = x.size(2), O = w.out_channels;
#ifdef WHITTLE_WITH_CUDA
  if (x.is_cuda())
    return detail::cuda::bitplane_conv(x, w, detail::conv_shape(N, 1, 1, w.planes.front(), {}, 1, 1), sb.scale, sb.bias)
        .reshape({N, O});
#endif
  const int64_t Pw = static_cast<int64_t>(w.planes.size());
  at::Tensor out = at::empty({N, O}, at::kFloat);
  float* y = out.data_ptr<float>();
  const float* scale = sb.scale.data_ptr<float>();
  const float* bias = sb.bias.data_ptr<float>();
  const uint64_t* xin = words_of(x);
  const detail::PopcountGemmFn gemm = detail::popcount_gemm();
  // Blocks of rows (samples); each block runs every plane pair.
  const int64_t row_words = std::max<int64_t>(1, O * Cw * P * Pw);
  whittle::parallel_for(0, N, std::max<int64_t>(1, kMinWordsPerTask / row_words), [&](int64_t n0, int64_t n1) {
    const int64_t M = n1 - n0;
    std::vector<int32_t> pop(static_cast<size_t>(M * O)), acc(static_cast<size_t>(Pw * M * O), 0);
    std::vector<int64_t> ones(static_cast<size_t>(M), 0);
    for (int64_t j = 0; j < P; ++j) {
      const uint64_t* a = xin + (j * N + n0) * Cw;
      for (int64_t m = 0; m < M; ++m) {
        int64_t c = 0;
        for (int64_t k = 0; k < Cw; ++k) c += popcount64(a[m * Cw + k]);
        ones[m] += c << j;
      }
      for (int64_t i = 0; i < Pw; ++i) {
        gemm(detail::BitOp::kAnd, a, Cw, words_of(w.planes[i].words), O, M, O, Cw, pop.data(), O);
        int32_t* acc_i = acc.data() + i * M * O;
        for (int64_t t = 0; t < M * O; ++t) acc_i[t] += pop[t] << j;
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < O; ++o) {
        double v = w.offset * static_cast<double>(ones[m]);
        for (int64_t i = 0; i < Pw; ++i) v += w.coefficients[i] * acc[(i * M + m) * O + o];
        y[(n0 + m) * O + o] = static_cast<float>(v) * scale[o] + bias[o];
      }
  });
  return out;
}

}  // namespace whittle::kernels
