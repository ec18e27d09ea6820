#include "fuse/fold_math.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <limits>
#include <string>

#include "core/error.h"

namespace whittle::fuse {

namespace {

std::string sizes_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void check_channels(const at::Tensor& t, int64_t c, const char* what) {
  if (!t.defined()) return;
  if (t.dim() != 1 || t.size(0) != c)
    throw Error(std::string("BN folding: ") + what + " has shape " + sizes_str(t) + ", expected [" + std::to_string(c) + "]");
  if (!t.is_floating_point()) throw Error(std::string("BN folding: ") + what + " is not a floating-point tensor");
}

int64_t output_channels(const at::Tensor& weight, WeightLayout layout, int64_t groups) {
  if (layout == WeightLayout::kOutputFirst) return weight.size(0);
  if (weight.dim() < 2) throw Error("BN folding: a transposed-convolution weight must have at least 2 dims, got " + sizes_str(weight));
  return weight.size(1) * groups;
}

// The BN tensors as float64 (γ = 1, β = 0 when absent), checked against `c` channels.
struct Bn64 {
  at::Tensor mean, var, gamma, beta;
};

Bn64 bn_as(const BatchNormParams& bn, int64_t c, at::ScalarType dtype) {
  check_channels(bn.running_mean, c, "running_mean");
  check_channels(bn.running_var, c, "running_var");
  check_channels(bn.weight, c, "BN weight (gamma)");
  check_channels(bn.bias, c, "BN bias (beta)");
  if (!bn.running_mean.defined() || !bn.running_var.defined())
    throw Error("BN folding: the BN layer has no running statistics (track_running_stats=False cannot be folded)");
  auto opts = bn.running_mean.options().dtype(dtype);
  Bn64 r;
  r.mean = bn.running_mean.to(dtype);
  r.var = bn.running_var.to(dtype);
  r.gamma = bn.weight.defined() ? bn.weight.to(dtype) : at::ones({c}, opts);
  r.beta = bn.bias.defined() ? bn.bias.to(dtype) : at::zeros({c}, opts);
  return r;
}

FoldedParams fold(const ConvBnParams& p, bool high_precision) {
  if (!p.weight.defined() || !p.weight.is_floating_point()) throw Error("BN folding: the layer's weight is not a floating-point tensor");
  const int64_t c = output_channels(p.weight, p.layout, p.groups);
  check_channels(p.bias, c, "layer bias");
  const at::ScalarType dtype = high_precision ? at::kDouble : p.weight.scalar_type();
  Bn64 bn = bn_as(p.bn, c, dtype);
  at::Tensor scale = bn.gamma / at::sqrt(bn.var + p.bn.eps);
  at::Tensor w = scale_output_channels(p.weight.to(dtype), scale, p.layout, p.groups);
  at::Tensor b = p.bias.defined() ? p.bias.to(dtype) : at::zeros({c}, scale.options());
  at::Tensor bias = bn.beta + (b - bn.mean) * scale;
  return {w.to(p.weight.scalar_type()), bias.to(p.weight.scalar_type())};
}

}  // namespace

at::Tensor bn_scale(const BatchNormParams& bn, bool high_precision) {
  if (!bn.running_var.defined()) throw Error("BN folding: the BN layer has no running_var");
  const int64_t c = bn.running_var.size(0);
  Bn64 b = bn_as(bn, c, high_precision ? at::kDouble : bn.running_var.scalar_type());
  return b.gamma / at::sqrt(b.var + bn.eps);
}

at::Tensor scale_output_channels(const at::Tensor& weight, const at::Tensor& scale, WeightLayout layout, int64_t groups) {
  const int64_t c = output_channels(weight, layout, groups);
  if (scale.dim() != 1 || scale.size(0) != c)
    throw Error("BN folding: scale has shape " + sizes_str(scale) + " but the weight " + sizes_str(weight) + " has " +
                std::to_string(c) + " output channels");
  at::Tensor s = scale.to(weight.scalar_type());
  if (layout == WeightLayout::kOutputFirst) {
    std::vector<int64_t> view(static_cast<size_t>(weight.dim()), 1);
    view[0] = c;
    return weight * s.reshape(view);
  }
  if (groups < 1 || weight.size(0) % groups != 0)
    throw Error("BN folding: groups=" + std::to_string(groups) + " does not divide the " + std::to_string(weight.size(0)) +
                " input channels of transposed-convolution weight " + sizes_str(weight));
  // [Cin, Cout/g, ...] → [g, Cin/g, Cout/g, ...]; the scale of group gi is scale[gi·Cout/g : (gi+1)·Cout/g].
  std::vector<int64_t> grouped{groups, weight.size(0) / groups};
  for (int64_t d = 1; d < weight.dim(); ++d) grouped.push_back(weight.size(d));
  std::vector<int64_t> view(grouped.size(), 1);
  view[0] = groups;
  view[2] = weight.size(1);
  return (weight.reshape(grouped) * s.reshape(view)).reshape(weight.sizes());
}

FoldedParams fold_conv_bn_params(const ConvBnParams& params) {
  at::NoGradGuard no_grad;
  FoldedParams f = fold(params, /*high_precision=*/true);
  return {f.weight.detach(), f.bias.detach()};
}

FoldedParams fold_conv_bn_params_differentiable(const ConvBnParams& params) { return fold(params, false); }

at::Tensor pad_kernel(const at::Tensor& kernel, int64_t kh, int64_t kw) {
  if (kernel.dim() != 4) throw Error("RepVGG: a kernel must be 4-D [Cout, Cin/g, kh, kw], got " + sizes_str(kernel));
  const int64_t dh = kh - kernel.size(2), dw = kw - kernel.size(3);
  if (dh < 0 || dw < 0 || dh % 2 || dw % 2)
    throw Error("RepVGG: cannot centre kernel " + sizes_str(kernel) + " in " + std::to_string(kh) + "×" + std::to_string(kw));
  if (dh == 0 && dw == 0) return kernel;
  return at::constant_pad_nd(kernel, {dw / 2, dw / 2, dh / 2, dh / 2}, 0.0);
}

at::Tensor identity_kernel(int64_t channels, int64_t groups, int64_t kh, int64_t kw, const at::TensorOptions& options) {
  if (groups < 1 || channels % groups != 0)
    throw Error("RepVGG: groups=" + std::to_string(groups) + " does not divide " + std::to_string(channels) + " channels");
  if (kh % 2 == 0 || kw % 2 == 0) throw Error("RepVGG: the identity kernel needs odd sizes, got " + std::to_string(kh) + "×" + std::to_string(kw));
  const int64_t per_group = channels / groups;
  at::Tensor k = at::zeros({channels, per_group, kh, kw}, options.dtype(at::kDouble).device(at::kCPU));
  auto acc = k.accessor<double, 4>();
  for (int64_t i = 0; i < channels; ++i) acc[i][i % per_group][kh / 2][kw / 2] = 1.0;
  return k.to(options);
}

FoldedParams merge_branches(const std::vector<FoldedParams>& branches, int64_t kh, int64_t kw) {
  if (branches.empty()) throw Error("RepVGG: no branches to merge");
  at::Tensor w, b;
  for (const auto& br : branches) {
    at::Tensor pw = pad_kernel(br.weight, kh, kw);
    if (w.defined() && (pw.sizes() != w.sizes() || br.bias.sizes() != b.sizes()))
      throw Error("RepVGG: branch kernel " + sizes_str(br.weight) + " does not match " + sizes_str(w));
    w = w.defined() ? w + pw : pw;
    b = b.defined() ? b + br.bias : br.bias;
  }
  return {w, b};
}

SignThreshold bn_sign_threshold(const BatchNormParams& bn) {
  if (!bn.running_mean.defined()) throw Error("BN threshold: the BN layer has no running_mean");
  at::NoGradGuard no_grad;
  const int64_t c = bn.running_mean.size(0);
  Bn64 b = bn_as(bn, c, at::kDouble);
  at::Tensor sigma = at::sqrt(b.var + bn.eps);
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor zero_gamma = b.gamma == 0;
  at::Tensor safe_gamma = at::where(zero_gamma, at::ones_like(b.gamma), b.gamma);
  at::Tensor tau = b.mean - b.beta * sigma / safe_gamma;
  // γ = 0: the BN output is the constant β, so the sign is +1 (τ = −∞) when β ≥ 0, else −1 (τ = +∞).
  at::Tensor constant_tau = at::where(b.beta >= 0, at::full_like(tau, -inf), at::full_like(tau, inf));
  tau = at::where(zero_gamma, constant_tau, tau);
  at::Tensor direction = at::where(b.gamma < 0, at::full_like(tau, -1.0), at::full_like(tau, 1.0));
  const at::ScalarType dtype = bn.running_mean.scalar_type();
  return {tau.to(dtype), direction.to(dtype)};
}

at::Tensor apply_sign_threshold(const at::Tensor& y, const at::Tensor& threshold, const at::Tensor& direction) {
  at::NoGradGuard no_grad;
  if (y.dim() < 2 || threshold.dim() != 1 || y.size(1) != threshold.size(0) || direction.sizes() != threshold.sizes())
    throw Error("threshold_sign: input " + sizes_str(y) + " does not fit threshold " + sizes_str(threshold) + " and direction " +
                sizes_str(direction));
  std::vector<int64_t> view(static_cast<size_t>(y.dim()), 1);
  view[1] = y.size(1);
  at::Tensor t = threshold.to(y.scalar_type()).reshape(view);
  at::Tensor d = direction.to(y.scalar_type()).reshape(view);
  at::Tensor positive = (y - t) * d >= 0;
  return at::where(positive, at::ones({}, y.options()), at::full({}, -1.0, y.options()));
}

}  // namespace whittle::fuse
