// int8 lowerings of the deploy runtime (deploy/int8.h): LibTorch's quantized CPU engine.

#include "deploy/int8.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <memory>
#include <optional>

#include "core/error.h"
#include "quantize/method.h"

namespace whittle::deploy {
namespace {

// The uint8 grid of an int8 quantizer node (an affine 8-bit grid with unsigned codes); nullopt
// for any other node.
struct Grid {
  double scale = 0.0;
  int64_t zero_point = 0;
  bool relu = false;  // a ReLU the quantizer stands for that its clamp at code 0 does not give
};
std::optional<Grid> uint8_grid(const Node& n) {
  if (n.op != "act_quant") return std::nullopt;
  const quantize::ActivationGrid g = quantize::activation_quantizer_of(n).grid(n);
  if (!g.affine || g.bits != 8 || g.signed_codes || g.sign || g.offset != 0.0) return std::nullopt;
  // The scale as the ONNX writer gives it to QuantizeLinear: the grid's top over 255 codes.
  return Grid{static_cast<float>(g.max / 255.0), g.zero_point, g.relu && g.zero_point != 0};
}

// The only user of `value` when it is a uint8 quantizer and the value no graph output.
const Node* quantizer_reading(const Lowering& l, const std::string& value) {
  const Graph& g = l.graph();
  if (g.is_output(value)) return nullptr;
  const std::vector<std::string> users = g.users(value);
  if (users.size() != 1) return nullptr;
  const Node& u = g.node(users[0]);
  return uint8_grid(u) ? &u : nullptr;
}

Form int8_form(const Grid& g) {
  Form f;
  f.int8 = true;
  f.int8_scale = g.scale;
  f.int8_zero_point = g.zero_point;
  return f;
}

// The codes of `v`, which a step of this file made (Form::int8).
const at::Tensor& codes_of(const Value& v) {
  if (!v.quantized().defined()) throw Error("int8 step: the input holds no integer codes");
  return v.quantized();
}

// Calls a registered operator boxed ("quantized::conv2d_prepack") and returns its only result.
c10::IValue call_op(const char* name, std::vector<c10::IValue> args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  std::vector<c10::IValue> stack = std::move(args);
  op.callBoxed(&stack);
  return stack.at(0);
}

// The int8 weight of a packed layer (uniform 8-bit codes c, value s·(c − 128)) as LibTorch's
// quantized tensor: qint8 codes c − 128 with one scale per output channel (or one per tensor),
// zero point 0. nullopt for any other weight.
std::optional<at::Tensor> int8_weight(const Node& n) {
  auto pc = packed_codes(n);
  if (!pc || pc->q.encoding != quantize::Encoding::kUniform || pc->q.bits != 8) return std::nullopt;
  const at::Tensor codes = (pc->codes - 128).to(at::kChar);
  const at::Tensor scale = pc->q.scale.to(at::kDouble).reshape({-1});
  if (scale.numel() == 1) return at::_make_per_tensor_quantized_tensor(codes, scale.item<double>(), 0);
  if (scale.numel() != codes.size(0)) return std::nullopt;
  return at::_make_per_channel_quantized_tensor(codes, scale, at::zeros({scale.numel()}, at::kLong), 0);
}

c10::IValue bias_of(const Node& n) {
  if (const at::Tensor* b = n.params.find("bias"); b && b->defined()) return b->detach().to(at::kFloat).contiguous();
  return c10::IValue();
}

// Prepacks a layer's weight (`name`: quantized::conv2d_prepack or linear_prepack); nullopt when the
// engine refuses it (a shape or grouping it has no kernel for), so that the layer runs in float.
std::optional<c10::IValue> prepack(const char* name, std::vector<c10::IValue> args) {
  try {
    return call_op(name, std::move(args));
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

}  // namespace

bool int8_kernels_available() {
#if defined(__x86_64__) || defined(__i386__)
  // cpuid directly: older compilers' __builtin_cpu_supports knows neither VNNI feature name.
  // AVX512_VNNI is leaf 7.0 ECX bit 11, AVX_VNNI leaf 7.1 EAX bit 4 (Intel SDM vol. 2, CPUID);
  // __builtin_cpu_supports checks that the OS saves the registers they use.
  static const bool vnni = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    bool avx512_vnni = false, avx_vnni = false;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) avx512_vnni = (ecx >> 11) & 1u;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) avx_vnni = (eax >> 4) & 1u;
    return (avx512_vnni && __builtin_cpu_supports("avx512f")) ||
           (avx_vnni && __builtin_cpu_supports("avx2"));
  }();
  return vnni;
#else
  return false;
#endif
}

bool lower_int8_quantize(const Node& n, Lowering& l) {
  const std::optional<Grid> g = uint8_grid(n);
  if (!g || !int8_kernels_available()) return false;
  const Grid grid = *g;
  l.add_step(n, "int8 quantize", [grid](std::vector<Value>& frame, const Step& s) {
    at::Tensor x = frame[s.inputs[0]].tensor();
    if (grid.relu) x = at::relu(x);
    if (x.dim() == 4) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    frame[s.outputs[0]] = Value::of_quantized(at::quantize_per_tensor(x, grid.scale, grid.zero_point, at::kQUInt8));
  });
  l.set_form(n.outputs[0], int8_form(grid));
  return true;
}

bool lower_int8_layer(const Node& n, Lowering& l) {
  if (!l.form(n.inputs.at(0)).int8 || n.inputs.size() != 1) return false;
  const Node* q = quantizer_reading(l, n.outputs.at(0));
  if (!q) return false;
  const std::optional<at::Tensor> weight = int8_weight(n);
  if (!weight) return false;
  const Grid out = *uint8_grid(*q);
  std::string kernel;
  std::function<at::Tensor(const at::Tensor&)> apply;
  if (n.op == "conv2d") {
    if (l.graph().value(n.inputs[0]).shape.size() != 4) return false;
    const std::optional<c10::IValue> packed =
        prepack("quantized::conv2d_prepack", {*weight, bias_of(n), n.attr_pair("stride"), n.attr_pair("padding"),
                                              n.attr_pair("dilation"), n.attr_int("groups")});
    if (!packed) return false;
    auto p = packed->toCustomClass<ConvPackedParamsBase<2>>();
    apply = [p, out](const at::Tensor& x) { return out.relu ? p->apply_relu(x, out.scale, out.zero_point)
                                                             : p->apply(x, out.scale, out.zero_point); };
    kernel = "int8 conv2d";
  } else if (n.op == "linear") {
    if (l.graph().value(n.inputs[0]).shape.size() != 2) return false;
    const std::optional<c10::IValue> packed = prepack("quantized::linear_prepack", {*weight, bias_of(n)});
    if (!packed) return false;
    auto p = packed->toCustomClass<LinearPackedParamsBase>();
    apply = [p, out](const at::Tensor& x) { return out.relu ? p->apply_relu(x, out.scale, out.zero_point)
                                                             : p->apply(x, out.scale, out.zero_point); };
    kernel = "int8 linear";
  } else {
    return false;
  }
  Step& step = l.add_step(n, kernel + " + requantize", [apply](std::vector<Value>& frame, const Step& s) {
    frame[s.outputs[0]] = Value::of_quantized(apply(codes_of(frame[s.inputs[0]])));
  });
  l.absorb(step, *q);
  l.set_form(q->outputs.at(0), int8_form(out));
  return true;
}

bool lower_int8_add(const Node& n, Lowering& l) {
  if (n.inputs.size() != 2 || !l.form(n.inputs[0]).int8 || !l.form(n.inputs[1]).int8) return false;
  const Node* q = quantizer_reading(l, n.outputs.at(0));
  if (!q) return false;
  const Grid out = *uint8_grid(*q);
  const Shape& a = l.graph().value(n.inputs[0]).shape;
  if (a != l.graph().value(n.inputs[1]).shape) return false;  // quantized::add does not broadcast
  static const auto add = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("quantized::add", "")
                              .typed<at::Tensor(at::Tensor, at::Tensor, double, int64_t)>();
  static const auto add_relu = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("quantized::add_relu", "")
                                   .typed<at::Tensor(at::Tensor, at::Tensor, double, int64_t)>();
  Step& step = l.add_step(n, "int8 add + requantize", [out](std::vector<Value>& frame, const Step& s) {
    const at::Tensor& x = codes_of(frame[s.inputs[0]]);
    const at::Tensor& y = codes_of(frame[s.inputs[1]]);
    frame[s.outputs[0]] =
        Value::of_quantized((out.relu ? add_relu : add).call(x, y, out.scale, out.zero_point));
  });
  l.absorb(step, *q);
  l.set_form(q->outputs.at(0), int8_form(out));
  return true;
}

bool lower_int8_move(const Node& n, Lowering& l) {
  const Form in = l.form(n.inputs.at(0));
  if (!in.int8) return false;
  if (n.op == "max_pool2d") {
    const auto k = n.attr_pair("kernel_size");
    const auto st = n.has_attr("stride") ? n.attr_pair("stride") : k;
    const auto p = n.attr_pair("padding");
    const auto d = n.attr_pair("dilation");
    const bool ceil = n.attr_bool("ceil_mode");
    l.add_step(n, "int8 max_pool2d", [k, st, p, d, ceil](std::vector<Value>& frame, const Step& s) {
      frame[s.outputs[0]] = Value::of_quantized(at::max_pool2d(codes_of(frame[s.inputs[0]]), k, st, p, d, ceil));
    });
  } else if (n.op == "flatten") {
    const int64_t start = n.attr_int("start_dim"), end = n.attr_int("end_dim");
    l.add_step(n, "int8 flatten", [start, end](std::vector<Value>& frame, const Step& s) {
      // Flatten follows the NCHW order of the values, whatever the codes' memory format.
      frame[s.outputs[0]] = Value::of_quantized(at::flatten(codes_of(frame[s.inputs[0]]).contiguous(), start, end));
    });
  } else {
    return false;
  }
  l.set_form(n.outputs[0], in);
  return true;
}

}  // namespace whittle::deploy
