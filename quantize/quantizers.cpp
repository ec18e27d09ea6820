#include "quantize/quantizers.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "graph/graph.h"
#include "quantize/fused_quantizers.h"

namespace whittle::quantize {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

const char* granularity_name(Granularity g) { return g == Granularity::kPerTensor ? "per_tensor" : "per_channel"; }

Granularity granularity_from_name(const std::string& text) {
  if (text == "per_tensor") return Granularity::kPerTensor;
  if (text == "per_channel") return Granularity::kPerChannel;
  throw Error("unknown granularity '" + text + "' (per_tensor, per_channel)");
}

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::kDoReFa: return "dorefa";
    case Encoding::kSign: return "sign";
    case Encoding::kTernary: return "ternary";
    case Encoding::kUniform: return "uniform";
  }
  return "?";
}

std::vector<std::string> encoding_names() {
  std::vector<std::string> names;
  for (Encoding e : {Encoding::kDoReFa, Encoding::kSign, Encoding::kTernary, Encoding::kUniform}) names.emplace_back(encoding_name(e));
  return names;
}

Encoding encoding_from_name(const std::string& text) {
  if (text == "dorefa") return Encoding::kDoReFa;
  if (text == "sign") return Encoding::kSign;
  if (text == "ternary") return Encoding::kTernary;
  if (text == "uniform") return Encoding::kUniform;
  throw Error("unknown weight encoding '" + text + "' (dorefa, sign, ternary, uniform)");
}

namespace {

std::atomic<int> g_fused{-1};       // -1: not yet read from the environment
std::atomic<int> g_fused_cuda{-1};  // -1: not yet read from the environment

// The setting `flag` holds, read from the environment variable `name` the first time: "0" turns it
// off, "1" on, anything else (or nothing) leaves `default_on`.
bool read_setting(std::atomic<int>& flag, const char* name, bool default_on) {
  int v = flag.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv(name);
    const bool on = env && std::strcmp(env, "0") == 0 ? false : env && std::strcmp(env, "1") == 0 ? true : default_on;
    int expected = -1;
    flag.compare_exchange_strong(expected, on ? 1 : 0);
    v = flag.load();
  }
  return v == 1;
}

}  // namespace

bool fused_quantizers_take(const at::Tensor& t) {
  return fused_quantizers_enabled() && fused::fused_supported(t) && (!t.is_cuda() || fused_quantizers_cuda_enabled());
}

bool fused_quantizers_enabled() { return read_setting(g_fused, "WHITTLE_FUSED_QUANTIZERS", true); }

void set_fused_quantizers(bool on) { g_fused.store(on ? 1 : 0); }

bool fused_quantizers_cuda_enabled() { return read_setting(g_fused_cuda, "WHITTLE_FUSED_QUANTIZERS_CUDA", false); }

void set_fused_quantizers_cuda(bool on) { g_fused_cuda.store(on ? 1 : 0); }

namespace {

// The floor of max|tanh w| as a divisor: 1e-12, or float16's smallest normal number 2^-14, to which
// 1e-12 would round to 0 (then an all-zero half weight divides 0 by 0).
double max_floor(at::ScalarType dtype) { return dtype == at::kHalf ? 6.103515625e-05 : 1e-12; }

void check_axis(const at::Tensor& w, int64_t axis, const char* who) {
  if (w.dim() < 1 || axis < 0 || axis >= w.dim())
    throw Error(std::string(who) + ": channel axis " + std::to_string(axis) + " out of range for a weight of shape " +
                shape_str(w.sizes().vec()));
}

// `t` [..., C at axis, ...] as [C, rest].
at::Tensor channel_rows(const at::Tensor& t, int64_t axis) { return t.movedim(axis, 0).reshape({t.size(axis), -1}); }

// mean|w| over the tensor ([1]) or per channel ([C]).
at::Tensor abs_mean(const at::Tensor& w, Granularity g, int64_t axis) {
  if (g == Granularity::kPerTensor) return w.abs().mean().reshape({1});
  return channel_rows(w.abs(), axis).mean(1);
}

at::Tensor abs_max(const at::Tensor& w, Granularity g, int64_t axis) {
  if (g == Granularity::kPerTensor) return w.abs().max().reshape({1});
  return std::get<0>(channel_rows(w.abs(), axis).max(1));
}

// A [1] or [C] scale shaped to broadcast against a tensor of rank `rank` along `axis`.
at::Tensor along(const at::Tensor& s, int64_t rank, int64_t axis) {
  std::vector<int64_t> shape(static_cast<size_t>(rank), 1);
  if (rank > 0) shape[static_cast<size_t>(axis)] = s.numel();
  return s.reshape(shape);
}

void check_bits(int64_t bits, int64_t lo, int64_t hi, bool allow32, const char* who) {
  if ((bits >= lo && bits <= hi) || (allow32 && bits == 32)) return;
  throw Error(std::string(who) + ": unsupported bit width " + std::to_string(bits) + " (" + std::to_string(lo) + ".." +
              std::to_string(hi) + (allow32 ? " or 32)" : ")"));
}

void check_activation_clip(double clip) {
  if (clip > 0 && std::isfinite(clip)) return;
  throw Error("DoReFa activations: activation_clip " + std::to_string(clip) + " (expected a finite value > 0)");
}

// clip·quantize_k(clip(x, 0, clip) / clip): the grid of 2^k levels on [0, clip]. For clip = 1 exactly
// quantize_k(clip(x, 0, 1)), the paper's quantizer, with the same ATen ops.
at::Tensor dorefa_activation_values(const at::Tensor& x, int64_t bits, double clip) {
  if (clip == 1.0) return quantize_k(x.clamp(0.0, 1.0), bits);
  return quantize_k(x.clamp(0.0, clip) / clip, bits) * clip;
}

// ±1 (sign(0) = +1, NaN → −1) with ATen ops.
at::Tensor sign_values(const at::Tensor& x) {
  return at::where(x >= 0, at::ones({}, x.options()), at::full({}, -1.0, x.options()));
}

// The fused DoReFa weight (k ≥ 2): tanh(w) through ATen, its max per tensor or channel and the
// values in one pass each; t and m are what the backward needs.
struct FusedDoReFaWeight {
  at::Tensor values, t, m;
};
FusedDoReFaWeight fused_dorefa_weight(const at::Tensor& w_in, int64_t bits, Granularity g, int64_t axis) {
  at::NoGradGuard no_grad;
  FusedDoReFaWeight f;
  f.t = at::tanh(w_in.detach());
  f.m = fused::abs_max(f.t, g == Granularity::kPerChannel, axis).clamp_min(max_floor(w_in.scalar_type()));
  f.values = fused::dorefa_weight_values(f.t, f.m, bits, axis);
  return f;
}

at::Tensor twn_values(const at::Tensor& w, Granularity g, int64_t axis);

// ---- autograd functions: forward rounds, backward is each method's straight-through surrogate.

// DoReFa weights, k = 1..8. k ≥ 2: d w_q / d w = (1 − tanh²w) / max|tanh w| (max held constant);
// k = 1: identity.
struct DoReFaWeightFn : public torch::autograd::Function<DoReFaWeightFn> {
  static Variable forward(AutogradContext* ctx, const Variable& w, int64_t bits, int64_t granularity, int64_t axis) {
    const auto g = static_cast<Granularity>(granularity);
    ctx->saved_data["bits"] = bits;
    ctx->saved_data["granularity"] = granularity;
    ctx->saved_data["axis"] = axis;
    const bool fused = bits >= 2 && w.numel() > 0 && fused_quantizers_take(w);
    ctx->saved_data["fused"] = fused;
    if (fused) {
      // Saves tanh(w) and the max, which the backward needs, instead of w (recomputing them).
      FusedDoReFaWeight f = fused_dorefa_weight(w, bits, g, axis);
      ctx->save_for_backward({f.t, f.m});
      return f.values;
    }
    EncodedWeight e = dorefa_encode(w, bits, g, axis);
    if (bits >= 2) ctx->save_for_backward({w});
    return decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, w.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t bits = ctx->saved_data["bits"].toInt();
    if (bits < 2) return {grad[0], Variable(), Variable(), Variable()};
    if (ctx->saved_data["fused"].toBool()) {
      const auto saved = ctx->get_saved_variables();
      return {fused::dorefa_weight_grad(grad[0], saved[0], saved[1], ctx->saved_data["axis"].toInt()), Variable(),
              Variable(), Variable()};
    }
    const Variable w = ctx->get_saved_variables()[0];
    const auto g = static_cast<Granularity>(ctx->saved_data["granularity"].toInt());
    const int64_t axis = ctx->saved_data["axis"].toInt();
    at::Tensor t = at::tanh(w);
    at::Tensor m = along(abs_max(t, g, axis).clamp_min(max_floor(w.scalar_type())), w.dim(), axis);
    return {grad[0] * (1 - t * t) / m, Variable(), Variable(), Variable()};
  }
};

// DoReFa activations: gradient 1 on [0, clip], 0 outside.
struct DoReFaActivationFn : public torch::autograd::Function<DoReFaActivationFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x, int64_t bits, double clip, bool after_relu) {
    ctx->saved_data["clip"] = clip;
    ctx->saved_data["after_relu"] = after_relu;
    const bool fused = fused_quantizers_take(x);
    ctx->saved_data["fused"] = fused;
    if (fused) {  // one pass; keeps one bit an element for the backward instead of x
      fused::MaskedOutput r = fused::dorefa_activation(x, bits, clip, /*with_mask=*/true, after_relu);
      ctx->save_for_backward({r.mask});
      return r.output;
    }
    ctx->save_for_backward({x});
    return dorefa_activation_values(x, bits, clip);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (ctx->saved_data["fused"].toBool())
      return {fused::mask_multiply(grad[0], ctx->get_saved_variables()[0]), Variable(), Variable(), Variable()};
    const Variable x = ctx->get_saved_variables()[0];
    const double clip = ctx->saved_data["clip"].toDouble();
    const at::Tensor low = ctx->saved_data["after_relu"].toBool() ? x > 0 : x >= 0;
    return {grad[0] * at::logical_and(low, x <= clip), Variable(), Variable(), Variable()};
  }
};

// TWN: gradient passed straight through.
struct TwnFn : public torch::autograd::Function<TwnFn> {
  static Variable forward(AutogradContext*, const Variable& w, int64_t granularity, int64_t axis) {
    return twn_values(w, static_cast<Granularity>(granularity), axis);
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], Variable(), Variable()}; }
};

// BNN sign: +1 for x ≥ 0, −1 otherwise; gradient 1 where |x| ≤ 1.
struct SignFn : public torch::autograd::Function<SignFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x) {
    const bool fused = fused_quantizers_take(x);
    ctx->saved_data["fused"] = fused;
    if (fused) {  // one pass; keeps the bits of |x| ≤ 1 instead of x
      fused::MaskedOutput r = fused::sign(x, /*with_mask=*/true);
      ctx->save_for_backward({r.mask});
      return r.output;
    }
    ctx->save_for_backward({x});
    return sign_values(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (ctx->saved_data["fused"].toBool()) return {fused::mask_multiply(grad[0], ctx->get_saved_variables()[0])};
    const Variable x = ctx->get_saved_variables()[0];
    return {grad[0] * (x.abs() <= 1)};
  }
};

bool needs_grad(const at::Tensor& t) { return t.requires_grad() && at::GradMode::is_enabled(); }

}  // namespace

at::Tensor decode_weight(const at::Tensor& codes, const at::Tensor& scale, Encoding encoding, int64_t bits, int64_t axis,
                         at::ScalarType dtype) {
  check_axis(codes, axis, "decode_weight");
  if (scale.numel() != 1 && scale.numel() != codes.size(axis))
    throw Error("decode_weight: scale has " + std::to_string(scale.numel()) + " elements; expected 1 or " +
                std::to_string(codes.size(axis)) + " (channels along axis " + std::to_string(axis) + ")");
  at::Tensor c = codes.to(dtype);
  at::Tensor s = along(scale.to(dtype), codes.dim(), axis);
  switch (encoding) {
    case Encoding::kDoReFa: {
      const double n = static_cast<double>((int64_t{1} << bits) - 1);
      return (c / n * 2 - 1) * s;
    }
    case Encoding::kSign: return (c * 2 - 1) * s;
    case Encoding::kTernary: return (c - 1) * s;
    case Encoding::kUniform: return (c - static_cast<double>(int64_t{1} << (bits - 1))) * s;
  }
  throw Error("decode_weight: unknown encoding");
}

at::Tensor quantize_k(const at::Tensor& r, int64_t bits) {
  check_bits(bits, 1, 16, false, "quantize_k");
  const double n = static_cast<double>((int64_t{1} << bits) - 1);
  return at::round(r * n) / n;
}

EncodedWeight dorefa_encode(const at::Tensor& w_in, int64_t bits, Granularity granularity, int64_t axis) {
  check_bits(bits, 1, 8, false, "DoReFa weights");
  check_axis(w_in, axis, "DoReFa weights");
  at::NoGradGuard no_grad;
  const at::Tensor w = w_in.detach();
  EncodedWeight e;
  e.axis = axis;
  e.bits = bits;
  if (bits == 1) {
    e.encoding = Encoding::kSign;
    e.codes = (w >= 0).to(w.scalar_type());
    e.scale = abs_mean(w, granularity, axis);
    return e;
  }
  e.encoding = Encoding::kDoReFa;
  const double n = static_cast<double>((int64_t{1} << bits) - 1);
  at::Tensor t = at::tanh(w);
  at::Tensor m = along(abs_max(t, granularity, axis).clamp_min(max_floor(w.scalar_type())), w.dim(), axis);
  e.codes = at::round((t / (m * 2) + 0.5) * n).clamp(0.0, n);
  e.scale = at::ones({1}, w.options());
  return e;
}

at::Tensor dorefa_weight(const at::Tensor& w, int64_t bits, Granularity granularity, int64_t axis) {
  check_bits(bits, 1, 8, true, "DoReFa weights");
  if (bits == 32) return w;
  if (!needs_grad(w)) {
    if (bits >= 2 && w.numel() > 0 && fused_quantizers_take(w)) return fused_dorefa_weight(w, bits, granularity, axis).values;
    EncodedWeight e = dorefa_encode(w, bits, granularity, axis);
    return decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, w.scalar_type());
  }
  return DoReFaWeightFn::apply(w, bits, static_cast<int64_t>(granularity), axis);
}

at::Tensor dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool after_relu) {
  check_bits(bits, 1, 8, true, "DoReFa activations");
  check_activation_clip(clip);
  if (bits == 32) return after_relu ? at::relu(x) : x;
  if (!needs_grad(x)) {
    if (fused_quantizers_take(x)) return fused::dorefa_activation(x, bits, clip, /*with_mask=*/false).output;
    return dorefa_activation_values(x, bits, clip);
  }
  return DoReFaActivationFn::apply(x, bits, clip, after_relu);
}

TwnThreshold twn_threshold(const at::Tensor& w_in, Granularity granularity, int64_t axis) {
  check_axis(w_in, axis, "TWN");
  at::NoGradGuard no_grad;
  const at::Tensor a = w_in.detach().abs();
  TwnThreshold r;
  r.delta = abs_mean(a, granularity, axis) * 0.7;
  at::Tensor mask = (a > along(r.delta, a.dim(), axis)).to(a.scalar_type());
  at::Tensor sum, count;
  if (granularity == Granularity::kPerTensor) {
    sum = (a * mask).sum().reshape({1});
    count = mask.sum().reshape({1});
  } else {
    sum = channel_rows(a * mask, axis).sum(1);
    count = channel_rows(mask, axis).sum(1);
  }
  r.alpha = at::where(count > 0, sum / count.clamp_min(1), at::zeros_like(sum));
  return r;
}

EncodedWeight twn_encode(const at::Tensor& w_in, Granularity granularity, int64_t axis) {
  TwnThreshold th = twn_threshold(w_in, granularity, axis);
  at::NoGradGuard no_grad;
  const at::Tensor w = w_in.detach();
  at::Tensor d = along(th.delta, w.dim(), axis);
  EncodedWeight e;
  e.encoding = Encoding::kTernary;
  e.bits = 2;
  e.axis = axis;
  e.codes = (w > d).to(w.scalar_type()) - (w < -d).to(w.scalar_type()) + 1;
  e.scale = th.alpha;
  return e;
}

namespace {

// decode_weight(twn_encode(w)): fused after the threshold where the kernels take w.
at::Tensor twn_values(const at::Tensor& w, Granularity g, int64_t axis) {
  if (w.numel() > 0 && fused_quantizers_take(w)) {
    check_axis(w, axis, "TWN");
    TwnThreshold th = twn_threshold(w, g, axis);
    at::NoGradGuard no_grad;
    return fused::ternary_values(w.detach(), th.delta, th.alpha, axis);
  }
  EncodedWeight e = twn_encode(w, g, axis);
  return decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, w.scalar_type());
}

}  // namespace

at::Tensor twn_weight(const at::Tensor& w, Granularity granularity, int64_t axis) {
  if (!needs_grad(w)) return twn_values(w, granularity, axis);
  return TwnFn::apply(w, static_cast<int64_t>(granularity), axis);
}

// Sign codes (1 where w ≥ 0, so sign(0) = +1) with the given scale: BNN and XNOR-Net share them.
static EncodedWeight sign_encoding(const at::Tensor& w, int64_t axis, at::Tensor scale) {
  EncodedWeight e;
  e.encoding = Encoding::kSign;
  e.bits = 1;
  e.axis = axis;
  e.codes = (w.detach() >= 0).to(w.scalar_type());
  e.scale = std::move(scale);
  return e;
}

EncodedWeight bnn_encode(const at::Tensor& w, int64_t axis) {
  check_axis(w, axis, "BNN");
  at::NoGradGuard no_grad;
  return sign_encoding(w, axis, at::ones({1}, w.options()));
}

at::Tensor bnn_sign(const at::Tensor& x) {
  if (!needs_grad(x)) return fused_quantizers_take(x) ? fused::sign(x, /*with_mask=*/false).output : sign_values(x);
  return SignFn::apply(x);
}

EncodedWeight xnor_encode(const at::Tensor& w, Granularity granularity, int64_t axis) {
  check_axis(w, axis, "XNOR-Net");
  at::NoGradGuard no_grad;
  return sign_encoding(w, axis, abs_mean(w.detach(), granularity, axis));
}

at::Tensor xnor_weight(const at::Tensor& w, bool detach_alpha, Granularity granularity, int64_t axis) {
  check_axis(w, axis, "XNOR-Net");
  at::Tensor alpha = abs_mean(detach_alpha ? w.detach() : w, granularity, axis);
  // ±1 times α is exact, so this equals decode_weight(sign codes, α) bitwise.
  return bnn_sign(w) * along(alpha, w.dim(), axis);
}

at::Tensor xnor_activation_scale(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                                 at::IntArrayRef padding) {
  if (x.dim() == 2) return x.abs().mean(1, /*keepdim=*/true);
  if (x.dim() != 4)
    throw Error("XNOR-Net activation scale: input must be [N, C, H, W] or [N, F], got " + shape_str(x.sizes().vec()));
  at::Tensor a = x.abs().mean(1, /*keepdim=*/true);
  return at::avg_pool2d(a, kernel, stride, padding, /*ceil_mode=*/false, /*count_include_pad=*/true);
}

}  // namespace whittle::quantize
