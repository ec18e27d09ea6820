#include "kernels/bitpack.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cuda_ops.h"

namespace whittle::kernels {

namespace detail {

std::string sizes_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void check_kernel_device(const at::Tensor& t, const std::string& what) {
  if (!t.defined() || t.is_cpu()) return;
#ifdef WHITTLE_WITH_CUDA
  if (t.is_cuda()) return;
  throw Error(what + ": a CPU or CUDA tensor is needed, got one on " + t.device().str());
#else
  throw Error(what + ": a CPU tensor is needed, got one on " + t.device().str() +
              (t.is_cuda() ? " (whittle was built without WHITTLE_CUDA: its CUDA kernels are not compiled)" : ""));
#endif
}

}  // namespace detail

namespace {

using detail::sizes_of;

// x as a contiguous float [rows, C] in channel-last order, and the packed output's shape.
struct ChannelLast {
  at::Tensor rows;  // float [R, C]
  std::vector<int64_t> packed_shape;
};

ChannelLast channel_last(const at::Tensor& x, const std::string& what) {
  if (!x.defined()) throw Error(what + ": undefined tensor");
  detail::check_kernel_device(x, what);
  if (!at::isFloatingType(x.scalar_type()))
    throw Error(std::string(what) + ": a floating-point tensor is needed, got " + std::string(c10::toString(x.scalar_type())));
  if (x.dim() == 2) return {x.to(at::kFloat).contiguous(), {x.size(0), words_for(x.size(1))}};
  if (x.dim() == 4)
    return {x.to(at::kFloat).permute({0, 2, 3, 1}).contiguous().reshape({x.size(0) * x.size(2) * x.size(3), x.size(1)}),
            {x.size(0), x.size(2), x.size(3), words_for(x.size(1))}};
  throw Error(std::string(what) + ": expected [N, C] or [N, C, H, W], got " + sizes_of(x));
}

}  // namespace

at::Tensor pack_signs(const at::Tensor& x) { return detail::pack_signs_named(x, "pack_signs"); }

namespace detail {

// pack_signs of a 4-D map read in its NCHW order (no channel-last copy of the floats): each
// channel's plane is read once, sequentially, and OR-ed into the bit of that channel in every
// position's word.
at::Tensor pack_signs_nchw(const at::Tensor& x) {
  const at::Tensor src_t = x.to(at::kFloat).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3), words = words_for(C);
  at::Tensor out = at::zeros({N, x.size(2), x.size(3), words}, at::kLong);
  const float* src = src_t.data_ptr<float>();
  auto* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  // Tasks: one image and a block of positions (whose words stay in cache across channels).
  constexpr int64_t kBlock = 1024;
  const int64_t blocks = (HW + kBlock - 1) / kBlock;
  whittle::parallel_for(0, N * blocks, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, C * std::min(HW, kBlock))),
                       [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / blocks, p0 = (t % blocks) * kBlock, p1 = std::min(HW, p0 + kBlock);
      uint64_t* __restrict w = dst + n * HW * words;
      for (int64_t c = 0; c < C; ++c) {
        const float* __restrict v = src + (n * C + c) * HW;
        const int64_t k = c / 64, b = c % 64;
        for (int64_t p = p0; p < p1; ++p) w[p * words + k] |= static_cast<uint64_t>(!(v[p] >= 0.0f)) << b;
      }
    }
  });
  return out;
}

at::Tensor pack_signs_named(const at::Tensor& x, const std::string& what) {
  if (x.defined() && x.dim() == 4 && x.is_cpu() && at::isFloatingType(x.scalar_type())) return pack_signs_nchw(x);
#ifdef WHITTLE_WITH_CUDA
  if (x.defined() && x.is_cuda() && (x.dim() == 2 || x.dim() == 4) && at::isFloatingType(x.scalar_type()))
    return cuda::pack_signs(x);
#endif
  ChannelLast cl = channel_last(x, what);
  const int64_t rows = cl.rows.size(0), channels = cl.rows.size(1), words = words_for(channels);
  at::Tensor out = at::empty(cl.packed_shape, at::kLong);
  const float* src = cl.rows.data_ptr<float>();
  auto* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  whittle::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, channels)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* v = src + r * channels;
      uint64_t* w = dst + r * words;
      for (int64_t k = 0; k < words; ++k) {
        const int64_t c0 = k * 64, n = std::min<int64_t>(64, channels - c0);
        uint64_t bits = 0;
        for (int64_t b = 0; b < n; ++b) bits |= static_cast<uint64_t>(!(v[c0 + b] >= 0.0f)) << b;
        w[k] = bits;
      }
    }
  });
  return out;
}

}  // namespace detail

at::Tensor pack_signs_reference(const at::Tensor& x) {
  detail::check_kernel_device(x, "pack_signs_reference");
  if (x.defined() && !x.is_cpu()) return pack_signs_reference(x.cpu()).to(x.device());
  ChannelLast cl = channel_last(x, "pack_signs_reference");
  const int64_t rows = cl.rows.size(0), channels = cl.rows.size(1), words = words_for(channels);
  at::Tensor out = at::zeros(cl.packed_shape, at::kLong);
  auto v = cl.rows.accessor<float, 2>();
  auto* w = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < channels; ++c)
      if (!(v[r][c] >= 0.0f)) w[r * words + c / 64] |= uint64_t{1} << (c % 64);
  return out;
}

at::Tensor unpack_signs(const at::Tensor& packed, int64_t channels) {
  if (channels < 1) throw Error("unpack_signs: channels must be ≥ 1, got " + std::to_string(channels));
  detail::check_kernel_device(packed, "unpack_signs");
  if (packed.defined() && !packed.is_cpu()) return unpack_signs(packed.cpu(), channels).to(packed.device());
  if (!packed.defined() || packed.scalar_type() != at::kLong || (packed.dim() != 2 && packed.dim() != 4) ||
      packed.size(-1) != words_for(channels))
    throw Error("unpack_signs: expected int64 [N, " + std::to_string(words_for(channels)) + "] or [N, H, W, " +
                std::to_string(words_for(channels)) + "] words for " + std::to_string(channels) + " channels, got " +
                (packed.defined() ? std::string(c10::toString(packed.scalar_type())) + " " + sizes_of(packed) : "undefined"));
  at::Tensor p = packed.contiguous();
  const int64_t rows = p.numel() / p.size(-1), words = p.size(-1);
  at::Tensor out = at::empty({rows, channels}, at::kFloat);
  const auto* w = reinterpret_cast<const uint64_t*>(p.data_ptr<int64_t>());
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < channels; ++c) o[r * channels + c] = (w[r * words + c / 64] >> (c % 64)) & 1 ? -1.0f : 1.0f;
  if (p.dim() == 2) return out;
  return out.reshape({p.size(0), p.size(1), p.size(2), channels}).permute({0, 3, 1, 2}).contiguous();
}

namespace {

// Output size of a pooling window along one axis, as at::max_pool2d (dilation 1): floor or ceil
// of (in + 2·pad − kernel) / stride + 1, where with ceil_mode the last window must start inside
// the input or its left padding.
int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - kernel;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

at::Tensor max_pool2d_signs(const at::Tensor& packed, const SignPool2dOptions& o) {
  const char* who = "max_pool2d_signs";
  detail::check_kernel_device(packed, who);
  if (!packed.defined() || packed.scalar_type() != at::kLong || packed.dim() != 4)
    throw Error(std::string(who) + ": expected packed signs, an int64 [N, H, W, words] tensor, got " +
                (packed.defined() ? std::string(c10::toString(packed.scalar_type())) + " " + sizes_of(packed) +
                                        " on " + packed.device().str()
                                  : "undefined"));
  if (o.kernel_h < 1 || o.kernel_w < 1 || o.stride_h < 1 || o.stride_w < 1 || o.pad_h < 0 || o.pad_w < 0 ||
      2 * o.pad_h > o.kernel_h || 2 * o.pad_w > o.kernel_w)
    throw Error(std::string(who) + ": kernel " + std::to_string(o.kernel_h) + "x" + std::to_string(o.kernel_w) +
                ", stride " + std::to_string(o.stride_h) + "x" + std::to_string(o.stride_w) + ", padding " +
                std::to_string(o.pad_h) + "x" + std::to_string(o.pad_w) +
                ": kernel and stride must be ≥ 1 and padding between 0 and half the kernel");
  const int64_t N = packed.size(0), H = packed.size(1), W = packed.size(2), Cw = packed.size(3);
  if (H + 2 * o.pad_h < o.kernel_h || W + 2 * o.pad_w < o.kernel_w)
    throw Error(std::string(who) + ": input " + sizes_of(packed) + " is smaller than the " +
                std::to_string(o.kernel_h) + "x" + std::to_string(o.kernel_w) + " window");
  const int64_t Ho = pool_output_size(H, o.kernel_h, o.stride_h, o.pad_h, o.ceil_mode);
  const int64_t Wo = pool_output_size(W, o.kernel_w, o.stride_w, o.pad_w, o.ceil_mode);
#ifdef WHITTLE_WITH_CUDA
  if (packed.is_cuda()) return detail::cuda::max_pool2d_signs(packed, o, Ho, Wo);
#endif
  at::Tensor in = packed.contiguous();
  at::Tensor out = at::empty({N, Ho, Wo, Cw}, at::kLong);
  const auto* src = reinterpret_cast<const uint64_t*>(in.data_ptr<int64_t>());
  auto* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Wo * Cw * o.kernel_h * o.kernel_w));
  whittle::parallel_for(0, N * Ho, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / Ho, ho = r % Ho;
      const int64_t h0 = std::max<int64_t>(0, ho * o.stride_h - o.pad_h);
      const int64_t h1 = std::min<int64_t>(H, ho * o.stride_h - o.pad_h + o.kernel_h);
      for (int64_t wo = 0; wo < Wo; ++wo) {
        const int64_t w0 = std::max<int64_t>(0, wo * o.stride_w - o.pad_w);
        const int64_t w1 = std::min<int64_t>(W, wo * o.stride_w - o.pad_w + o.kernel_w);
        uint64_t* y = dst + ((n * Ho + ho) * Wo + wo) * Cw;
        for (int64_t k = 0; k < Cw; ++k) y[k] = ~uint64_t{0};
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            const uint64_t* x = src + ((n * H + h) * W + w) * Cw;
            for (int64_t k = 0; k < Cw; ++k) y[k] &= x[k];
          }
      }
    }
  });
  return out;
}

}  // namespace whittle::kernels
