#include "quantize/fused_quantizers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/isa.h"
#include "core/parallel.h"
#include "graph/graph.h"
#include "quantize/quantize_simd.h"
#ifdef WHITTLE_WITH_CUDA
#include "quantize/fused_quantizers_cuda.h"
#endif

namespace whittle::quantize::detail {

const QuantizeSimd& quantize_simd() {
  switch (active_isa()) {
#if defined(__x86_64__) || defined(_M_X64)
    case Isa::kAvx512: return kQuantizeSimdAvx512;
    case Isa::kAvx2: return kQuantizeSimdAvx2;
#endif
    default: return kQuantizeSimdScalar;
  }
}

}  // namespace whittle::quantize::detail

namespace whittle::quantize::fused {

namespace {

std::string sizes_of(const at::Tensor& t) { return shape_str(t.sizes().vec()); }

// Elements a task takes: a multiple of 64, so that every task starts on a mask byte of its own.
constexpr int64_t kBlock = 64;
constexpr int64_t kGrainBlocks = 32768 / kBlock;

void check_input(const at::Tensor& t, const char* who) {
  if (!fused_supported(t))
    throw Error(std::string(who) + ": needs a contiguous float32 tensor on the CPU" +
#ifdef WHITTLE_WITH_CUDA
                " or a CUDA device" +
#endif
                ", got " +
                (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + sizes_of(t) + " on " + t.device().str()
                             : std::string("an undefined tensor")));
}

// Whether `t` lies where the fused kernels run: the CPU, or a CUDA device in a CUDA build.
bool fused_supported_device(const at::Tensor& t) {
#ifdef WHITTLE_WITH_CUDA
  if (t.is_cuda()) return true;
#endif
  return t.is_cpu();
}

at::Tensor new_mask(int64_t n) { return at::empty({(n + 7) / 8}, at::TensorOptions().dtype(at::kByte)); }

// f(begin, end) over [0, n) in tasks of whole 64-element blocks.
template <class F>
void for_blocks(int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  whittle::parallel_for(0, blocks, kGrainBlocks, [&](int64_t b, int64_t e) {
    const int64_t begin = b * kBlock, end = std::min(n, e * kBlock);
    if (begin < end) f(begin, end);
  });
}

// A weight as [outer, C, inner] around its channel axis, and a [1] or [C] per-channel vector.
struct ChannelView {
  int64_t outer = 1, channels = 1, inner = 1;
};

ChannelView channel_view(const at::Tensor& t, int64_t axis, const char* who) {
  if (t.dim() < 1 || axis < 0 || axis >= t.dim())
    throw Error(std::string(who) + ": channel axis " + std::to_string(axis) + " out of range for a tensor of shape " +
                sizes_of(t));
  ChannelView v;
  for (int64_t d = 0; d < axis; ++d) v.outer *= t.size(d);
  v.channels = t.size(axis);
  for (int64_t d = axis + 1; d < t.dim(); ++d) v.inner *= t.size(d);
  return v;
}

// The [1] or [C] vector `s` as contiguous float32, checked against the view.
at::Tensor channel_vector(const at::Tensor& s, const ChannelView& v, const char* who, const char* what) {
  if (!s.defined() || !s.is_cpu() || (s.numel() != 1 && s.numel() != v.channels))
    throw Error(std::string(who) + ": " + what + " must be a CPU tensor of 1 or " + std::to_string(v.channels) +
                " elements, got " + (s.defined() ? sizes_of(s) : std::string("an undefined tensor")));
  return s.to(at::kFloat).contiguous();
}

// f(row_begin, row_end, c, offset) for every row (o, c) of `inner` contiguous elements, in tasks
// of whole rows.
template <class F>
void for_rows(const ChannelView& v, F f) {
  const int64_t rows = v.outer * v.channels;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, v.inner));
  whittle::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) f(r % v.channels, r * v.inner, v.inner);
  });
}

}  // namespace

bool fused_supported(const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.is_sparse()) return false;
#ifdef WHITTLE_WITH_CUDA
  if (t.is_cuda()) return true;
#endif
  return t.is_cpu();
}

// The CUDA form of a function, for a tensor on a CUDA device (after the checks every device shares).
#ifdef WHITTLE_WITH_CUDA
#define WHITTLE_FUSED_ON_CUDA(t, call) \
  if ((t).is_cuda()) return cuda::call
#else
#define WHITTLE_FUSED_ON_CUDA(t, call)
#endif

MaskedOutput dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool with_mask, bool after_relu) {
  check_input(x, "fused DoReFa activation");
  if (bits < 1 || bits > 16)
    throw Error("fused DoReFa activation: unsupported bit width " + std::to_string(bits) + " (1..16)");
  if (!(clip > 0) || !std::isfinite(clip))
    throw Error("fused DoReFa activation: clip " + std::to_string(clip) + " (expected a finite value > 0)");
  WHITTLE_FUSED_ON_CUDA(x, dorefa_activation(x, bits, clip, with_mask, after_relu));
  const int64_t n = x.numel();
  MaskedOutput out{at::empty_like(x), with_mask ? new_mask(n) : at::Tensor()};
  const float* src = x.data_ptr<float>();
  float* dst = out.output.data_ptr<float>();
  uint8_t* mask = with_mask ? out.mask.data_ptr<uint8_t>() : nullptr;
  const auto levels = static_cast<float>((int64_t{1} << bits) - 1);
  const auto c = static_cast<float>(clip);
  const bool unit = clip == 1.0;
  const auto& k = detail::quantize_simd();
  for_blocks(n, [&](int64_t b, int64_t e) {
    k.dorefa_activation(src + b, dst + b, mask ? mask + b / 8 : nullptr, e - b, c, levels, unit, after_relu);
  });
  return out;
}

MaskedOutput sign(const at::Tensor& x, bool with_mask) {
  check_input(x, "fused sign");
  WHITTLE_FUSED_ON_CUDA(x, sign(x, with_mask));
  const int64_t n = x.numel();
  MaskedOutput out{at::empty_like(x), with_mask ? new_mask(n) : at::Tensor()};
  const float* src = x.data_ptr<float>();
  float* dst = out.output.data_ptr<float>();
  uint8_t* mask = with_mask ? out.mask.data_ptr<uint8_t>() : nullptr;
  const auto& k = detail::quantize_simd();
  for_blocks(n, [&](int64_t b, int64_t e) { k.sign(src + b, dst + b, mask ? mask + b / 8 : nullptr, e - b); });
  return out;
}

at::Tensor mask_multiply(const at::Tensor& grad_in, const at::Tensor& mask) {
  const int64_t n = grad_in.numel();
  if (!mask.defined() || mask.scalar_type() != at::kByte || mask.numel() != (n + 7) / 8 || !fused_supported_device(mask))
    throw Error("fused mask multiply: the mask must be uint8 [" + std::to_string((n + 7) / 8) + "] for a gradient of " +
                std::to_string(n) + " elements, got " +
                (mask.defined() ? std::string(c10::toString(mask.scalar_type())) + " " + sizes_of(mask)
                                : std::string("an undefined tensor")));
  WHITTLE_FUSED_ON_CUDA(mask, mask_multiply(grad_in, mask));
  const at::Tensor g = grad_in.to(mask.device(), at::kFloat).contiguous();
  const at::Tensor m = mask.contiguous();
  at::Tensor dx = at::empty_like(g);
  const float* gp = g.data_ptr<float>();
  const uint8_t* mp = m.data_ptr<uint8_t>();
  float* out = dx.data_ptr<float>();
  const auto& k = detail::quantize_simd();
  for_blocks(n, [&](int64_t b, int64_t e) { k.mask_multiply(gp + b, mp + b / 8, out + b, e - b); });
  return dx;
}

at::Tensor abs_max(const at::Tensor& t, bool per_channel, int64_t axis) {
  check_input(t, "fused abs max");
  if (t.numel() == 0) throw Error("fused abs max: empty tensor " + sizes_of(t));
  ChannelView v = channel_view(t, axis, "fused abs max");
  WHITTLE_FUSED_ON_CUDA(t, abs_max(t, per_channel, axis));
  const float* p = t.data_ptr<float>();
  if (!per_channel) v = ChannelView{1, 1, t.numel()};
  at::Tensor out = at::empty({v.channels}, at::TensorOptions().dtype(at::kFloat));
  float* m = out.data_ptr<float>();
  // One task a channel: the maximum over its outer × inner elements; NaN wins, as ATen's max.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, v.outer * v.inner));
  whittle::parallel_for(0, v.channels, grain, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      float best = 0.0f;
      bool nan = false;
      for (int64_t o = 0; o < v.outer; ++o) {
        const float* row = p + (o * v.channels + c) * v.inner;
        for (int64_t i = 0; i < v.inner; ++i) {
          const float a = std::fabs(row[i]);
          nan |= a != a;
          best = a > best ? a : best;
        }
      }
      m[c] = nan ? std::numeric_limits<float>::quiet_NaN() : best;
    }
  });
  return out;
}

at::Tensor dorefa_weight_values(const at::Tensor& t, const at::Tensor& m_in, int64_t bits, int64_t axis) {
  check_input(t, "fused DoReFa weight");
  if (bits < 2 || bits > 8) throw Error("fused DoReFa weight: unsupported bit width " + std::to_string(bits) + " (2..8)");
  const ChannelView v = channel_view(t, axis, "fused DoReFa weight");
  WHITTLE_FUSED_ON_CUDA(t, dorefa_weight_values(t, m_in, bits, axis));
  const at::Tensor m = channel_vector(m_in, v, "fused DoReFa weight", "the max");
  const bool per_channel = m.numel() > 1;
  at::Tensor out = at::empty_like(t);
  const float* src = t.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const auto n = static_cast<float>((int64_t{1} << bits) - 1);
  for_rows(v, [&](int64_t c, int64_t offset, int64_t len) {
    const float m2 = mp[per_channel ? c : 0] * 2.0f;
    for (int64_t i = offset; i < offset + len; ++i) {
      // dorefa_encode: round((t / (2m) + 0.5)·n) clamped to [0, n]; decode_weight: c / n · 2 − 1.
      float code = std::nearbyint((src[i] / m2 + 0.5f) * n);
      code = std::min(std::max(code, 0.0f), n);
      dst[i] = code / n * 2.0f - 1.0f;
    }
  });
  return out;
}

at::Tensor dorefa_weight_grad(const at::Tensor& grad_in, const at::Tensor& t, const at::Tensor& m_in, int64_t axis) {
  check_input(t, "fused DoReFa weight gradient");
  if (grad_in.numel() != t.numel())
    throw Error("fused DoReFa weight gradient: gradient " + sizes_of(grad_in) + " for a weight " + sizes_of(t));
  const ChannelView v = channel_view(t, axis, "fused DoReFa weight gradient");
  WHITTLE_FUSED_ON_CUDA(t, dorefa_weight_grad(grad_in, t, m_in, axis));
  const at::Tensor m = channel_vector(m_in, v, "fused DoReFa weight gradient", "the max");
  const at::Tensor g = grad_in.to(t.device(), at::kFloat).contiguous();
  const bool per_channel = m.numel() > 1;
  at::Tensor out = at::empty_like(t);
  const float* gp = g.data_ptr<float>();
  const float* tp = t.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for_rows(v, [&](int64_t c, int64_t offset, int64_t len) {
    const float mc = mp[per_channel ? c : 0];
    for (int64_t i = offset; i < offset + len; ++i) dst[i] = gp[i] * (1.0f - tp[i] * tp[i]) / mc;
  });
  return out;
}

at::Tensor ternary_values(const at::Tensor& w, const at::Tensor& delta_in, const at::Tensor& alpha_in, int64_t axis) {
  check_input(w, "fused TWN weight");
  const ChannelView v = channel_view(w, axis, "fused TWN weight");
  WHITTLE_FUSED_ON_CUDA(w, ternary_values(w, delta_in, alpha_in, axis));
  const at::Tensor delta = channel_vector(delta_in, v, "fused TWN weight", "the threshold");
  const at::Tensor alpha = channel_vector(alpha_in, v, "fused TWN weight", "the scale");
  const bool per_channel_delta = delta.numel() > 1, per_channel_alpha = alpha.numel() > 1;
  at::Tensor out = at::empty_like(w);
  const float* src = w.data_ptr<float>();
  const float* dp = delta.data_ptr<float>();
  const float* ap = alpha.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for_rows(v, [&](int64_t c, int64_t offset, int64_t len) {
    const float d = dp[per_channel_delta ? c : 0], a = ap[per_channel_alpha ? c : 0];
    for (int64_t i = offset; i < offset + len; ++i) {
      const float code = (src[i] > d ? 1.0f : 0.0f) - (src[i] < -d ? 1.0f : 0.0f) + 1.0f;
      dst[i] = (code - 1.0f) * a;
    }
  });
  return out;
}

namespace {

// round half to even of |v| ≤ 2^22 (quantize_simd.h), which compilers vectorize where nearbyint
// is a call.
inline float round_half_even(float v) { return detail::round_half_even_small(v); }

void check_lsq(const at::Tensor& x, int64_t q_n, int64_t q_p, const char* who) {
  check_input(x, who);
  if (!x.is_cpu()) throw Error(std::string(who) + ": CPU tensors only");
  if (q_p <= 0 || q_n < 0 || q_p > (int64_t{1} << 20) || q_n > (int64_t{1} << 20))
    throw Error(std::string(who) + ": grid [" + std::to_string(-q_n) + ", " + std::to_string(q_p) + "] out of range");
}

// Elements a chunk of the gradient sums takes: fixed, so that the sums do not depend on the threads
// (each chunk's float lanes hold 512 terms; the chunks add up in double).
constexpr int64_t kSumChunk = 4096;

}  // namespace

at::Tensor lsq(const at::Tensor& x, float step, float offset, bool has_offset, int64_t q_n, int64_t q_p) {
  check_lsq(x, q_n, q_p, "fused LSQ");
  at::Tensor out = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float lo = -static_cast<float>(q_n), hi = static_cast<float>(q_p);
  const float s = step, b = offset;
  for_blocks(x.numel(), [&](int64_t begin, int64_t end) {
    if (has_offset) {
      for (int64_t i = begin; i < end; ++i) {
        const float v = (src[i] - b) / s;
        dst[i] = round_half_even(std::min(std::max(v, lo), hi)) * s + b;
      }
    } else {
      for (int64_t i = begin; i < end; ++i) {
        const float v = src[i] / s;
        dst[i] = round_half_even(std::min(std::max(v, lo), hi)) * s;
      }
    }
  });
  return out;
}

LsqGradients lsq_backward(const at::Tensor& grad_in, const at::Tensor& x, float step, float offset, bool has_offset,
                          int64_t q_n, int64_t q_p) {
  check_lsq(x, q_n, q_p, "fused LSQ backward");
  const at::Tensor grad = grad_in.to(at::kFloat).contiguous();
  if (grad.numel() != x.numel())
    throw Error("fused LSQ backward: a gradient of " + std::to_string(grad.numel()) + " elements for an input of " +
                std::to_string(x.numel()));
  LsqGradients out;
  out.input = at::empty(grad.sizes(), grad.options());
  const float* xs = x.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* gx = out.input.data_ptr<float>();
  const float lo = -static_cast<float>(q_n), hi = static_cast<float>(q_p);
  const float s = step, b = has_offset ? offset : 0.0f;
  const int64_t n = x.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> step_sums(static_cast<size_t>(chunks)), offset_sums(static_cast<size_t>(chunks));
  const auto& k = detail::quantize_simd();
  whittle::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t begin = c * kSumChunk, end = std::min(n, begin + kSumChunk);
      // kLanes float sums (element i into lane i mod kLanes), the instruction set's microkernel
      // (quantize/quantize_simd.h; every variant gives the same sums), added in double in lane
      // order. b is 0 without an offset (x − 0 is x).
      constexpr int kLanes = detail::kLsqLanes;
      float ds_lane[kLanes] = {}, db_lane[kLanes] = {};
      k.lsq_backward(xs + begin, g + begin, gx + begin, end - begin, s, b, lo, hi, ds_lane, db_lane);
      double ds_sum = 0.0, db_sum = 0.0;
      for (int l = 0; l < kLanes; ++l) {
        ds_sum += ds_lane[l];
        db_sum += db_lane[l];
      }
      step_sums[static_cast<size_t>(c)] = ds_sum;
      offset_sums[static_cast<size_t>(c)] = db_sum;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    out.step += step_sums[static_cast<size_t>(c)];
    out.offset += offset_sums[static_cast<size_t>(c)];
  }
  return out;
}

at::Tensor pact(const at::Tensor& x, float alpha, float step) {
  check_lsq(x, 0, 1, "fused PACT");
  at::Tensor out = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for_blocks(x.numel(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = round_half_even(std::min(std::max(src[i], 0.0f), alpha) / step) * step;
  });
  return out;
}

std::pair<at::Tensor, double> pact_backward(const at::Tensor& grad_in, const at::Tensor& x, float alpha, bool after_relu) {
  check_lsq(x, 0, 1, "fused PACT backward");
  const at::Tensor grad = grad_in.to(at::kFloat).contiguous();
  if (grad.numel() != x.numel())
    throw Error("fused PACT backward: a gradient of " + std::to_string(grad.numel()) + " elements for an input of " +
                std::to_string(x.numel()));
  at::Tensor gx_t = at::empty(grad.sizes(), grad.options());
  const float* xs = x.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* gx = gx_t.data_ptr<float>();
  const int64_t n = x.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> sums(static_cast<size_t>(chunks));
  whittle::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t begin = c * kSumChunk, end = std::min(n, begin + kSumChunk);
      constexpr int kLanes = 8;  // as lsq_backward's
      float lane[kLanes] = {};
      int64_t i = begin;
      for (; i + kLanes <= end; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          const float xi = xs[i + l], gi = g[i + l];
          const bool low = after_relu ? xi > 0.0f : xi >= 0.0f;
          const bool above = xi >= alpha;
          gx[i + l] = low && !above ? gi : 0.0f;
          lane[l] += above ? gi : 0.0f;
        }
      }
      for (; i < end; ++i) {
        const bool low = after_relu ? xs[i] > 0.0f : xs[i] >= 0.0f;
        const bool above = xs[i] >= alpha;
        gx[i] = low && !above ? g[i] : 0.0f;
        lane[0] += above ? g[i] : 0.0f;
      }
      double sum = 0.0;
      for (float v : lane) sum += v;
      sums[static_cast<size_t>(c)] = sum;
    }
  });
  double total = 0.0;
  for (double v : sums) total += v;
  return {gx_t, total};
}

}  // namespace whittle::quantize::fused
