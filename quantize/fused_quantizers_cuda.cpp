// The fused quantizers on CUDA tensors (quantize/fused_quantizers.h): checks, allocation on the
// tensor's device, and the launches of quantize/quantize_cuda.cu on the current stream.

#include "quantize/fused_quantizers_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "core/error.h"
#include "graph/graph.h"
#include "quantize/quantize_cuda.h"

namespace whittle::quantize::fused::cuda {

namespace {

void check_launch(int code, const char* who) {
  if (code != 0) throw Error(std::string(who) + ": CUDA kernel launch failed: " + detail::quantize_cuda_error_string(code));
}

void* stream_of(const at::Tensor& t) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

detail::CudaChannelView view_of(const at::Tensor& t, int64_t axis) {
  return cuda_body::channel_view(t.sizes().data(), t.dim(), axis, false);
}

// The [1] or [C] vector `s` as contiguous float32 on t's device.
at::Tensor channel_vector(const at::Tensor& s, const at::Tensor& t, int64_t channels, const char* who, const char* what) {
  if (!s.defined() || (s.numel() != 1 && s.numel() != channels))
    throw Error(std::string(who) + ": " + what + " must have 1 or " + std::to_string(channels) + " elements, got " +
                (s.defined() ? shape_str(s.sizes().vec()) : std::string("an undefined tensor")));
  return s.to(t.device(), at::kFloat).contiguous();
}

}  // namespace

MaskedOutput dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool with_mask, bool after_relu) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.numel();
  MaskedOutput out{at::empty_like(x), with_mask ? at::empty({(n + 7) / 8}, x.options().dtype(at::kByte)) : at::Tensor()};
  check_launch(detail::dorefa_activation_cuda(x.data_ptr<float>(), out.output.data_ptr<float>(),
                                              with_mask ? out.mask.data_ptr<uint8_t>() : nullptr, n,
                                              static_cast<float>(clip), static_cast<int>(bits), after_relu, stream_of(x)),
               "fused DoReFa activation");
  return out;
}

MaskedOutput sign(const at::Tensor& x, bool with_mask) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.numel();
  MaskedOutput out{at::empty_like(x), with_mask ? at::empty({(n + 7) / 8}, x.options().dtype(at::kByte)) : at::Tensor()};
  check_launch(detail::sign_cuda(x.data_ptr<float>(), out.output.data_ptr<float>(),
                                 with_mask ? out.mask.data_ptr<uint8_t>() : nullptr, n, stream_of(x)),
               "fused sign");
  return out;
}

at::Tensor mask_multiply(const at::Tensor& grad_in, const at::Tensor& mask_in) {
  const c10::cuda::CUDAGuard guard(mask_in.device());
  const at::Tensor g = grad_in.to(mask_in.device(), at::kFloat).contiguous();
  const at::Tensor m = mask_in.contiguous();
  at::Tensor dx = at::empty_like(g);
  check_launch(detail::mask_multiply_cuda(g.data_ptr<float>(), m.data_ptr<uint8_t>(), dx.data_ptr<float>(), g.numel(),
                                          stream_of(g)),
               "fused mask multiply");
  return dx;
}

at::Tensor abs_max(const at::Tensor& t, bool per_channel, int64_t axis) {
  // One ATen reduction (NaN propagates, as on the CPU); the maximum does not depend on the order.
  if (!per_channel) return t.abs().max().reshape({1});
  return std::get<0>(t.abs().movedim(axis, 0).reshape({t.size(axis), -1}).max(1));
}

at::Tensor dorefa_weight_values(const at::Tensor& t, const at::Tensor& m_in, int64_t bits, int64_t axis) {
  const c10::cuda::CUDAGuard guard(t.device());
  detail::CudaChannelView v = view_of(t, axis);
  const at::Tensor m = channel_vector(m_in, t, v.channels, "fused DoReFa weight", "the max");
  v.per_channel = m.numel() > 1;
  at::Tensor out = at::empty_like(t);
  check_launch(detail::dorefa_weight_values_cuda(t.data_ptr<float>(), m.data_ptr<float>(), out.data_ptr<float>(), v,
                                                 static_cast<int>(bits), stream_of(t)),
               "fused DoReFa weight");
  return out;
}

at::Tensor dorefa_weight_grad(const at::Tensor& grad_in, const at::Tensor& t, const at::Tensor& m_in, int64_t axis) {
  const c10::cuda::CUDAGuard guard(t.device());
  detail::CudaChannelView v = view_of(t, axis);
  const at::Tensor m = channel_vector(m_in, t, v.channels, "fused DoReFa weight gradient", "the max");
  v.per_channel = m.numel() > 1;
  const at::Tensor g = grad_in.to(t.device(), at::kFloat).contiguous();
  at::Tensor out = at::empty_like(t);
  check_launch(detail::dorefa_weight_grad_cuda(g.data_ptr<float>(), t.data_ptr<float>(), m.data_ptr<float>(),
                                               out.data_ptr<float>(), v, stream_of(t)),
               "fused DoReFa weight gradient");
  return out;
}

at::Tensor ternary_values(const at::Tensor& w, const at::Tensor& delta_in, const at::Tensor& alpha_in, int64_t axis) {
  const c10::cuda::CUDAGuard guard(w.device());
  const detail::CudaChannelView v = view_of(w, axis);
  const at::Tensor delta = channel_vector(delta_in, w, v.channels, "fused TWN weight", "the threshold");
  const at::Tensor alpha = channel_vector(alpha_in, w, v.channels, "fused TWN weight", "the scale");
  at::Tensor out = at::empty_like(w);
  check_launch(detail::ternary_values_cuda(w.data_ptr<float>(), delta.data_ptr<float>(), alpha.data_ptr<float>(),
                                           out.data_ptr<float>(), v, delta.numel() > 1, alpha.numel() > 1, stream_of(w)),
               "fused TWN weight");
  return out;
}

namespace {

// The one-element float32 tensor `s` on t's device, contiguous; an undefined `s` (no offset) as it is.
at::Tensor scalar_on(const at::Tensor& s, const at::Tensor& t, const char* who, const char* what) {
  if (!s.defined()) return s;
  if (s.numel() != 1)
    throw Error(std::string(who) + ": " + what + " must have one element, got " + shape_str(s.sizes().vec()));
  return s.to(t.device(), at::kFloat).reshape({1}).contiguous();
}

float* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The upstream gradient as contiguous float32 on x's device; throws unless it has x's element count.
at::Tensor gradient_for(const at::Tensor& grad, const at::Tensor& x, const char* who) {
  const at::Tensor g = grad.to(x.device(), at::kFloat).contiguous();
  if (g.numel() != x.numel())
    throw Error(std::string(who) + ": a gradient of " + std::to_string(g.numel()) + " elements for an input of " +
                std::to_string(x.numel()));
  return g;
}

// LSQ's step ([1] or [C] along `axis`), offset and x's channel view, as the kernels take them.
struct LsqOperands {
  at::Tensor step, offset;
  detail::CudaChannelView view;
};
LsqOperands lsq_operands(const at::Tensor& x, const at::Tensor& step, const at::Tensor& offset, int64_t axis,
                         const char* who) {
  LsqOperands o;
  o.view = step.numel() > 1 ? view_of(x, axis) : detail::CudaChannelView{1, 1, x.numel(), false};
  o.step = channel_vector(step.reshape({-1}), x, o.view.channels, who, "the step");
  o.view.per_channel = o.step.numel() > 1;
  o.offset = scalar_on(offset, x, who, "the offset");
  return o;
}

}  // namespace

at::Tensor lsq(const at::Tensor& x, const at::Tensor& step, const at::Tensor& offset, int64_t q_n, int64_t q_p,
               int64_t axis) {
  const c10::cuda::CUDAGuard guard(x.device());
  const LsqOperands o = lsq_operands(x, step, offset, axis, "fused LSQ");
  at::Tensor out = at::empty_like(x);
  check_launch(detail::lsq_cuda(x.data_ptr<float>(), o.step.data_ptr<float>(), data_or_null(o.offset),
                                out.data_ptr<float>(), o.view, -static_cast<float>(q_n), static_cast<float>(q_p),
                                stream_of(x)),
               "fused LSQ");
  return out;
}

LsqTerms lsq_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& step, const at::Tensor& offset,
                      int64_t q_n, int64_t q_p, int64_t axis) {
  const c10::cuda::CUDAGuard guard(x.device());
  const LsqOperands o = lsq_operands(x, step, offset, axis, "fused LSQ backward");
  const at::Tensor g = gradient_for(grad, x, "fused LSQ backward");
  LsqTerms out{at::empty_like(x), at::empty_like(x), o.offset.defined() ? at::empty_like(x) : at::Tensor()};
  check_launch(detail::lsq_backward_cuda(g.data_ptr<float>(), x.data_ptr<float>(), o.step.data_ptr<float>(),
                                         data_or_null(o.offset), out.input.data_ptr<float>(),
                                         out.step.data_ptr<float>(), data_or_null(out.offset), o.view,
                                         -static_cast<float>(q_n), static_cast<float>(q_p), stream_of(x)),
               "fused LSQ backward");
  return out;
}

at::Tensor pact(const at::Tensor& x, const at::Tensor& alpha_in, const at::Tensor& step_in) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor alpha = scalar_on(alpha_in, x, "fused PACT", "the clip level");
  const at::Tensor step = scalar_on(step_in, x, "fused PACT", "the step");
  if (!alpha.defined() || !step.defined()) throw Error("fused PACT: the clip level and the step must be given");
  at::Tensor out = at::empty_like(x);
  check_launch(detail::pact_cuda(x.data_ptr<float>(), alpha.data_ptr<float>(), step.data_ptr<float>(),
                                 out.data_ptr<float>(), x.numel(), stream_of(x)),
               "fused PACT");
  return out;
}

std::pair<at::Tensor, at::Tensor> pact_backward(const at::Tensor& grad_in, const at::Tensor& x,
                                                const at::Tensor& alpha_in, bool after_relu) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor alpha = scalar_on(alpha_in, x, "fused PACT backward", "the clip level");
  if (!alpha.defined()) throw Error("fused PACT backward: the clip level must be given");
  const at::Tensor g = gradient_for(grad_in, x, "fused PACT backward");
  at::Tensor dx = at::empty_like(x), terms = at::empty_like(x);
  check_launch(detail::pact_backward_cuda(g.data_ptr<float>(), x.data_ptr<float>(), alpha.data_ptr<float>(),
                                          dx.data_ptr<float>(), terms.data_ptr<float>(), x.numel(), after_relu,
                                          stream_of(x)),
               "fused PACT backward");
  return {dx, terms};
}

}  // namespace whittle::quantize::fused::cuda
