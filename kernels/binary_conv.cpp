#include "kernels/binary_conv.h"

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/bitpack.h"
#include "kernels/cuda_ops.h"
#include "kernels/im2col.h"
#include "kernels/popcount_gemm.h"

namespace whittle::kernels {
namespace {

using detail::sizes_of;

// Work below which a range is not split further across threads (about 10 µs of popcounts).
constexpr int64_t kMinWordsPerTask = 1 << 16;

const uint64_t* words_of(const at::Tensor& t) { return reinterpret_cast<const uint64_t*>(t.data_ptr<int64_t>()); }

// The epilogue's tensors as float pointers (threshold, direction: null where undefined), checked against O.
struct Epilogue {
  enum Kind { kDot, kFloat, kSign } kind = kDot;
  at::Tensor scale_t, bias_t, threshold_t, direction_t;
  const float *scale = nullptr, *bias = nullptr, *threshold = nullptr, *direction = nullptr;

  static at::Tensor vector_of(const at::Tensor& t, int64_t out_channels, const char* name, const at::Device& device) {
    if (!t.defined()) return t;
    if (t.dim() != 1 || t.size(0) != out_channels)
      throw Error(std::string("binary layer epilogue: ") + name + " has shape " + sizes_of(t) + ", expected [" +
                  std::to_string(out_channels) + "]");
    return t.to(device, at::kFloat).contiguous();
  }

  // The epilogue's vectors as float [O] on `device` (the layer's input's).
  Epilogue(Kind k, const BinaryEpilogue& e, int64_t out_channels, const at::Device& device) : kind(k) {
    if (k == kDot) return;
    // Missing scale/bias become 1/0, so that the store loops have no branches.
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    if (!e.scale.defined()) scale_t = at::ones({out_channels}, options);
    if (!e.bias.defined()) bias_t = at::zeros({out_channels}, options);
    if (e.scale.defined()) scale_t = vector_of(e.scale, out_channels, "scale", device);
    if (e.bias.defined()) bias_t = vector_of(e.bias, out_channels, "bias", device);
    threshold_t = vector_of(e.threshold, out_channels, "threshold", device);
    direction_t = vector_of(e.direction, out_channels, "direction", device);
    if (threshold_t.defined() != direction_t.defined())
      throw Error("binary layer epilogue: threshold and direction go together (one of them is missing)");
    if (threshold_t.defined()) kind = kSign;
    scale = scale_t.data_ptr<float>();
    bias = bias_t.data_ptr<float>();
    threshold = threshold_t.defined() ? threshold_t.data_ptr<float>() : nullptr;
    direction = direction_t.defined() ? direction_t.data_ptr<float>() : nullptr;
  }

  float value(int32_t dot, int64_t o) const { return static_cast<float>(dot) * scale[o] + bias[o]; }

  // Packs the threshold_sign of y for O channels from dots[o] into ⌈O/64⌉ words at out.
  void pack(const int32_t* dots, int64_t out_channels, uint64_t* out) const {
    for (int64_t k = 0; k < words_for(out_channels); ++k) {
      uint64_t bits = 0;
      const int64_t o0 = k * 64, n = std::min<int64_t>(64, out_channels - o0);
      for (int64_t b = 0; b < n; ++b) {
        const int64_t o = o0 + b;
        const bool positive = (value(dots[o], o) - threshold[o]) * direction[o] >= 0.0f;
        bits |= static_cast<uint64_t>(!positive) << b;
      }
      out[k] = bits;
    }
  }
};

void check_packed_input(const at::Tensor& x, int64_t rank, const PackedBinaryWeight& w, const char* what) {
  detail::check_kernel_device(x, what);
  const int64_t T = w.kernel_h * w.kernel_w, Cw = words_for(w.in_channels);
  const bool weight_ok = w.words.defined() && w.words.scalar_type() == at::kLong &&
                         w.words.is_contiguous() && w.words.dim() == 2 && w.words.size(0) == T * Cw &&
                         w.words.size(1) == w.out_channels && w.tap_popcount.defined() &&
                         w.tap_popcount.device() == w.words.device() &&
                         w.tap_popcount.scalar_type() == at::kInt && w.tap_popcount.is_contiguous() &&
                         w.tap_popcount.dim() == 2 && w.tap_popcount.size(0) == T &&
                         w.tap_popcount.size(1) == w.out_channels && w.in_channels >= 1 && T >= 1;
  if (!weight_ok)
    throw Error(std::string(what) + ": the weight is not packed as pack_binary_weight packs it (words int64 [" +
                std::to_string(T * Cw) + ", " + std::to_string(w.out_channels) + "], tap_popcount int32 [" +
                std::to_string(T) + ", " + std::to_string(w.out_channels) + "], contiguous, on one device)");
  if (!x.defined() || x.scalar_type() != at::kLong || x.dim() != rank || x.size(-1) != Cw)
    throw Error(std::string(what) + ": expected packed input int64 " + (rank == 4 ? "[N, H, W, " : "[N, ") +
                std::to_string(Cw) + "] for " + std::to_string(w.in_channels) + " input channels, got " +
                (x.defined() ? std::string(c10::toString(x.scalar_type())) + " " + sizes_of(x) + " on " + x.device().str()
                             : "undefined"));
  if (x.device() != w.words.device())
    throw Error(std::string(what) + ": the packed input is on " + x.device().str() + " and the weight on " +
                w.words.device().str() + " (PackedBinaryWeight::to moves a weight)");
}

// The device a layer runs on: its packed input's (checked first, so that the epilogue's vectors
// are moved only to a device the kernels run on; an undefined input is refused later, by name).
at::Device input_device(const at::Tensor& packed_input, const char* who) {
  detail::check_kernel_device(packed_input, who);
  return packed_input.defined() ? packed_input.device() : at::Device(at::kCPU);
}

#ifdef WHITTLE_WITH_CUDA
detail::cuda::Output cuda_output(Epilogue::Kind k) {
  return k == Epilogue::kDot ? detail::cuda::Output::kDot
                             : k == Epilogue::kFloat ? detail::cuda::Output::kFloat : detail::cuda::Output::kSign;
}
#endif

at::Tensor conv(const at::Tensor& packed_input, const PackedBinaryWeight& w, const BinaryConv2dOptions& opt,
                const Epilogue& e) {
  check_packed_input(packed_input, 4, w, "binary_conv2d");
  if (opt.stride_h < 1 || opt.stride_w < 1 || opt.pad_h < 0 || opt.pad_w < 0)
    throw Error("binary_conv2d: stride must be ≥ 1 and padding ≥ 0, got stride (" + std::to_string(opt.stride_h) + ", " +
                std::to_string(opt.stride_w) + "), padding (" + std::to_string(opt.pad_h) + ", " +
                std::to_string(opt.pad_w) + ")");
  const at::Tensor x = packed_input.contiguous();
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), Cw = x.size(3);
  const int64_t O = w.out_channels, C = w.in_channels, KH = w.kernel_h, KW = w.kernel_w, T = KH * KW, K = T * Cw;
  const int64_t Ho = conv_output_size(H, KH, opt.stride_h, opt.pad_h);
  const int64_t Wo = conv_output_size(W, KW, opt.stride_w, opt.pad_w);
#ifdef WHITTLE_WITH_CUDA
  if (x.is_cuda())
    return detail::cuda::binary_conv(x, w, detail::conv_shape(N, H, W, w, opt, Ho, Wo), cuda_output(e.kind), e.scale_t,
                                     e.bias_t, e.threshold_t, e.direction_t);
#endif
  at::Tensor out;
  if (e.kind == Epilogue::kSign) out = at::empty({N, Ho, Wo, words_for(O)}, at::kLong);
  else out = at::empty({N, O, Ho, Wo}, e.kind == Epilogue::kDot ? at::kInt : at::kFloat);
  const uint64_t* xin = words_of(x);
  const uint64_t* wts = words_of(w.words);
  const int32_t* tap_pop = w.tap_popcount.data_ptr<int32_t>();
  const detail::PopcountGemmFn gemm = detail::popcount_gemm();
  int32_t* out_int = e.kind == Epilogue::kDot ? out.data_ptr<int32_t>() : nullptr;
  float* out_float = e.kind == Epilogue::kFloat ? out.data_ptr<float>() : nullptr;
  uint64_t* out_bits = e.kind == Epilogue::kSign ? reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()) : nullptr;

  // A thread gets at least kMinWordsPerTask popcount words (small layers run on one thread).
  const int64_t row_words = std::max<int64_t>(1, Wo * O * K);
  whittle::parallel_for(0, N * Ho, std::max<int64_t>(1, kMinWordsPerTask / row_words), [&](int64_t begin, int64_t end) {
    detail::RowInput input(H, W, Cw, KH, KW, opt, Wo);
    std::vector<int32_t> pop(static_cast<size_t>(Wo * O));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / Ho, oh = r % Ho;
      const int64_t ih0 = oh * opt.stride_h - opt.pad_h;
      const uint64_t* a = input.row(xin, n, oh);
      gemm(detail::BitOp::kXor, a, K, wts, O, Wo, O, K, pop.data(), O);
      // Popcounts → dots in place: d = C·(valid taps) − 2·(popcount − popcount of the padded taps' weights).
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t iw0 = ow * opt.stride_w - opt.pad_w;
        int32_t* p = pop.data() + ow * O;
        int64_t valid = 0;
        for (int64_t i = 0; i < KH; ++i)
          for (int64_t j = 0; j < KW; ++j)
            valid += (ih0 + i >= 0 && ih0 + i < H && iw0 + j >= 0 && iw0 + j < W);
        const int32_t k_valid = static_cast<int32_t>(C * valid);
        for (int64_t o = 0; o < O; ++o) p[o] = k_valid - 2 * p[o];
        if (valid == T) continue;
        for (int64_t i = 0; i < KH; ++i)
          for (int64_t j = 0; j < KW; ++j)
            if (ih0 + i < 0 || ih0 + i >= H || iw0 + j < 0 || iw0 + j >= W) {
              const int32_t* tp = tap_pop + (i * KW + j) * O;
              for (int64_t o = 0; o < O; ++o) p[o] += 2 * tp[o];
            }
      }
      // The epilogue, one output channel's row at a time (contiguous stores in NCHW).
      const int64_t plane = Ho * Wo;
      const int32_t* d = pop.data();
      switch (e.kind) {
        case Epilogue::kDot:
          for (int64_t o = 0; o < O; ++o) {
            int32_t* dst = out_int + (n * O + o) * plane + oh * Wo;
            for (int64_t ow = 0; ow < Wo; ++ow) dst[ow] = d[ow * O + o];
          }
          break;
        case Epilogue::kFloat:
          for (int64_t o = 0; o < O; ++o) {
            float* dst = out_float + (n * O + o) * plane + oh * Wo;
            const float sc = e.scale[o], b = e.bias[o];
            for (int64_t ow = 0; ow < Wo; ++ow) dst[ow] = static_cast<float>(d[ow * O + o]) * sc + b;
          }
          break;
        case Epilogue::kSign:
          for (int64_t ow = 0; ow < Wo; ++ow) e.pack(d + ow * O, O, out_bits + (n * plane + oh * Wo + ow) * words_for(O));
          break;
      }
    }
  });
  return out;
}

at::Tensor linear(const at::Tensor& packed_input, const PackedBinaryWeight& w, const Epilogue& e) {
  check_packed_input(packed_input, 2, w, "binary_linear");
  if (w.kernel_h != 1 || w.kernel_w != 1)
    throw Error("binary_linear: the weight is a " + std::to_string(w.kernel_h) + "×" + std::to_string(w.kernel_w) +
                " convolution's, expected a linear layer's [O, C]");
  const at::Tensor x = packed_input.contiguous();
  const int64_t N = x.size(0), Cw = x.size(1), O = w.out_channels, C = w.in_channels;
#ifdef WHITTLE_WITH_CUDA
  if (x.is_cuda()) {
    const at::Tensor y = detail::cuda::binary_conv(x, w, detail::conv_shape(N, 1, 1, w, {}, 1, 1), cuda_output(e.kind),
                                                   e.scale_t, e.bias_t, e.threshold_t, e.direction_t);
    return y.reshape({N, e.kind == Epilogue::kSign ? words_for(O) : O});
  }
#endif
  at::Tensor pop = at::empty({N, O}, at::kInt);
  const detail::PopcountGemmFn gemm = detail::popcount_gemm();
  const uint64_t* xin = words_of(x);
  const uint64_t* wts = words_of(w.words);
  int32_t* p = pop.data_ptr<int32_t>();
  // Blocks of output channels, so that batch 1 also spreads over the threads.
  whittle::parallel_for(0, O, std::max<int64_t>(16, kMinWordsPerTask / std::max<int64_t>(1, N * Cw)), [&](int64_t o0, int64_t o1) {
    gemm(detail::BitOp::kXor, xin, Cw, wts + o0, O, N, o1 - o0, Cw, p + o0, O);
  });
  // dot = C − 2·popcount, in place (int32 [N, O]).
  const int64_t count = N * O;
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<int32_t>(C) - 2 * p[i];
  if (e.kind == Epilogue::kDot) return pop;
  if (e.kind == Epilogue::kSign) {
    at::Tensor out = at::empty({N, words_for(O)}, at::kLong);
    for (int64_t n = 0; n < N; ++n)
      e.pack(p + n * O, O, reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()) + n * words_for(O));
    return out;
  }
  at::Tensor out = at::empty({N, O}, at::kFloat);
  float* y = out.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) y[n * O + o] = e.value(p[n * O + o], o);
  return out;
}

}  // namespace

namespace detail {

cuda_body::ConvShape conv_shape(int64_t N, int64_t H, int64_t W, const PackedBinaryWeight& w,
                                const BinaryConv2dOptions& opt, int64_t Ho, int64_t Wo) {
  cuda_body::ConvShape s;
  s.N = N;
  s.H = H;
  s.W = W;
  s.C = w.in_channels;
  s.Cw = words_for(w.in_channels);
  s.O = w.out_channels;
  s.KH = w.kernel_h;
  s.KW = w.kernel_w;
  s.stride_h = opt.stride_h;
  s.stride_w = opt.stride_w;
  s.pad_h = opt.pad_h;
  s.pad_w = opt.pad_w;
  s.Ho = Ho;
  s.Wo = Wo;
  return s;
}

void gather_row(const uint64_t* x, int64_t H, int64_t W, int64_t Cw, int64_t KH, int64_t KW,
                const BinaryConv2dOptions& opt, int64_t n, int64_t oh, int64_t Wo, uint64_t* dst) {
  const int64_t ih0 = oh * opt.stride_h - opt.pad_h;
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const int64_t iw0 = ow * opt.stride_w - opt.pad_w;
    const bool row_inside = iw0 >= 0 && iw0 + KW <= W;
    for (int64_t i = 0; i < KH; ++i) {
      const int64_t ih = ih0 + i;
      if (ih < 0 || ih >= H) {
        std::memset(dst, 0, sizeof(uint64_t) * KW * Cw);
        dst += KW * Cw;
      } else if (row_inside) {  // the kernel row's taps are adjacent in NHWC
        std::memcpy(dst, x + ((n * H + ih) * W + iw0) * Cw, sizeof(uint64_t) * KW * Cw);
        dst += KW * Cw;
      } else {
        for (int64_t j = 0; j < KW; ++j, dst += Cw) {
          const int64_t iw = iw0 + j;
          if (iw < 0 || iw >= W) std::memset(dst, 0, sizeof(uint64_t) * Cw);
          else std::memcpy(dst, x + ((n * H + ih) * W + iw) * Cw, sizeof(uint64_t) * Cw);
        }
      }
    }
  }
}

}  // namespace detail

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  if (stride < 1 || pad < 0 || kernel < 1)
    throw Error("convolution: stride must be ≥ 1, padding ≥ 0 and the kernel ≥ 1, got stride " + std::to_string(stride) +
                ", padding " + std::to_string(pad) + ", kernel " + std::to_string(kernel));
  if (in + 2 * pad < kernel)
    throw Error("convolution: input size " + std::to_string(in) + " with padding " + std::to_string(pad) +
                " is smaller than the kernel " + std::to_string(kernel));
  return (in + 2 * pad - kernel) / stride + 1;
}

PackedBinaryWeight PackedBinaryWeight::to(const at::Device& device) const {
  PackedBinaryWeight p = *this;
  if (words.defined()) p.words = words.to(device);
  if (tap_popcount.defined()) p.tap_popcount = tap_popcount.to(device);
  return p;
}

PackedBinaryWeight pack_binary_weight(const at::Tensor& weight) {
  if (!weight.defined() || (weight.dim() != 2 && weight.dim() != 4))
    throw Error("pack_binary_weight: expected a weight [O, C] or [O, C, kh, kw], got " +
                (weight.defined() ? sizes_of(weight) : std::string("undefined")));
  detail::check_kernel_device(weight, "pack_binary_weight");
  // Packed once, on the CPU, and moved to the weight's device.
  if (!weight.is_cpu()) return pack_binary_weight(weight.cpu()).to(weight.device());
  PackedBinaryWeight p;
  p.out_channels = weight.size(0);
  p.in_channels = weight.size(1);
  p.kernel_h = weight.dim() == 4 ? weight.size(2) : 1;
  p.kernel_w = weight.dim() == 4 ? weight.size(3) : 1;
  const int64_t T = p.kernel_h * p.kernel_w, Cw = words_for(p.in_channels);
  if (p.in_channels < 1 || T < 1 || p.in_channels * T >= (int64_t{1} << 30))
    throw Error("pack_binary_weight: " + sizes_of(weight) + " has " + std::to_string(p.in_channels * T) +
                " weights per output channel; the kernels take 1 to 2^30 − 1");
  // [O, C, kh, kw] → [O·kh·kw, C] rows, packed per row: [O, T·Cw].
  at::Tensor rows = weight.dim() == 4 ? weight.permute({0, 2, 3, 1}).reshape({p.out_channels * T, p.in_channels}) : weight;
  at::Tensor per_channel = detail::pack_signs_named(rows, "pack_binary_weight").reshape({p.out_channels, T * Cw}).contiguous();
  p.words = per_channel.t().contiguous();  // K-major for the microkernels
  p.tap_popcount = at::empty({T, p.out_channels}, at::kInt);
  const uint64_t* w = words_of(per_channel);
  int32_t* tp = p.tap_popcount.data_ptr<int32_t>();
  for (int64_t o = 0; o < p.out_channels; ++o)
    for (int64_t t = 0; t < T; ++t) {
      int32_t c = 0;
      for (int64_t k = 0; k < Cw; ++k) c += __builtin_popcountll(w[(o * T + t) * Cw + k]);
      tp[t * p.out_channels + o] = c;
    }
  return p;
}

at::Tensor binary_conv2d_dot(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                             const BinaryConv2dOptions& options) {
  return conv(packed_input, weight, options, Epilogue(Epilogue::kDot, {}, weight.out_channels, input_device(packed_input, "binary_conv2d")));
}

at::Tensor binary_conv2d(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                         const BinaryConv2dOptions& options, const BinaryEpilogue& epilogue) {
  return conv(packed_input, weight, options, Epilogue(Epilogue::kFloat, epilogue, weight.out_channels, input_device(packed_input, "binary_conv2d")));
}

at::Tensor binary_linear_dot(const at::Tensor& packed_input, const PackedBinaryWeight& weight) {
  return linear(packed_input, weight, Epilogue(Epilogue::kDot, {}, weight.out_channels, input_device(packed_input, "binary_linear")));
}

at::Tensor binary_linear(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                         const BinaryEpilogue& epilogue) {
  return linear(packed_input, weight, Epilogue(Epilogue::kFloat, epilogue, weight.out_channels, input_device(packed_input, "binary_linear")));
}

at::Tensor binary_conv2d_reference(const at::Tensor& x, const at::Tensor& w, const BinaryConv2dOptions& opt) {
  if (!x.defined() || !w.defined()) throw Error("binary_conv2d_reference: x and w must be defined tensors");
  detail::check_kernel_device(x, "binary_conv2d_reference");
  detail::check_kernel_device(w, "binary_conv2d_reference");
  if (!x.is_cpu() || !w.is_cpu()) return binary_conv2d_reference(x.cpu(), w.cpu(), opt).to(x.device());
  if (x.dim() != 4 || w.dim() != 4 || x.size(1) != w.size(1))
    throw Error("binary_conv2d_reference: expected x [N, C, H, W] and w [O, C, kh, kw], got " + sizes_of(x) + " and " +
                sizes_of(w));
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), KH = w.size(2), KW = w.size(3);
  const int64_t Ho = conv_output_size(H, KH, opt.stride_h, opt.pad_h), Wo = conv_output_size(W, KW, opt.stride_w, opt.pad_w);
  auto xa = x.to(at::kFloat).contiguous();
  auto wa = w.to(at::kFloat).contiguous();
  auto xv = xa.accessor<float, 4>();
  auto wv = wa.accessor<float, 4>();
  at::Tensor out = at::zeros({N, O, Ho, Wo}, at::kInt);
  auto ov = out.accessor<int32_t, 4>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          int32_t s = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t ih = oh * opt.stride_h - opt.pad_h + i, iw = ow * opt.stride_w - opt.pad_w + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;  // zero padding: contributes 0
                const int32_t a = xv[n][c][ih][iw] < 0 ? -1 : 1, b = wv[o][c][i][j] < 0 ? -1 : 1;
                s += a * b;
              }
          ov[n][o][oh][ow] = s;
        }
  return out;
}

}  // namespace whittle::kernels
