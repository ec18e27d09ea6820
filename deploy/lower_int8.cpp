// int8 lowerings of the deploy runtime (deploy/int8.h): whittle's int8 kernels, and LibTorch's
// quantized CPU engine for the convolutions they do not take.

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
#include "kernels/int8_conv.h"
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

// The int8 codes [O, C, kh, kw] (or [O, C]) and one scale per output channel of a packed layer
// (uniform 8-bit codes c, value s·(c − 128)); nullopt for any other weight.
struct Int8Codes {
  Shape sizes;
  std::vector<int8_t> codes;
  std::vector<float> scale;
};
std::optional<Int8Codes> int8_codes(const Node& n) {
  auto pc = packed_codes(n);
  if (!pc || pc->q.encoding != quantize::Encoding::kUniform || pc->q.bits != 8) return std::nullopt;
  const at::Tensor codes = (pc->codes - 128).to(at::kChar).contiguous();
  const at::Tensor scale = pc->q.scale.to(at::kFloat).reshape({-1}).contiguous();
  const int64_t O = codes.size(0);
  if (scale.numel() != 1 && scale.numel() != O) return std::nullopt;
  Int8Codes out;
  out.sizes = codes.sizes().vec();
  out.codes.assign(codes.data_ptr<int8_t>(), codes.data_ptr<int8_t>() + codes.numel());
  out.scale.resize(static_cast<size_t>(O));
  for (int64_t o = 0; o < O; ++o) out.scale[o] = scale.data_ptr<float>()[scale.numel() == 1 ? 0 : o];
  return out;
}

const uint8_t* bytes_of(const at::Tensor& codes) { return reinterpret_cast<const uint8_t*>(codes.data_ptr<c10::quint8>()); }

// A layer on kernels::Int8Conv2d (a linear layer as a 1 × 1 convolution of a 1 × 1 map); nullptr
// when the kernels do not take it (no vector variant here, grouping, dilation, a weight that is not
// int8, a sum that could overflow).
std::shared_ptr<const kernels::Int8Conv2d> own_kernel(const Node& n) {
  if (kernels::int8_variant() == kernels::Int8Variant::kScalar) return nullptr;
  const std::optional<Int8Codes> codes = int8_codes(n);
  if (!codes) return nullptr;
  kernels::Int8ConvShape shape;
  const Shape& w = codes->sizes;
  if (n.op == "conv2d") {
    if (n.attr_int("groups") != 1 || n.attr_pair("dilation") != std::vector<int64_t>{1, 1} || w.size() != 4)
      return nullptr;
    const std::vector<int64_t> stride = n.attr_pair("stride"), padding = n.attr_pair("padding");
    shape.kernel_h = w[2];
    shape.kernel_w = w[3];
    shape.stride_h = stride[0];
    shape.stride_w = stride[1];
    shape.pad_h = padding[0];
    shape.pad_w = padding[1];
  } else if (w.size() != 2) {
    return nullptr;
  }
  shape.out_channels = w[0];
  shape.in_channels = w[1];
  if (shape.in_channels * shape.kernel_h * shape.kernel_w >= 65536) return nullptr;
  std::vector<float> bias;
  if (const at::Tensor* b = n.params.find("bias"); b && b->defined()) {
    const at::Tensor f = b->detach().to(at::kFloat).contiguous();
    bias.assign(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  }
  return std::make_shared<const kernels::Int8Conv2d>(shape, codes->codes.data(), codes->scale.data(),
                                                     bias.empty() ? nullptr : bias.data());
}

}  // namespace

bool fbgemm_exact() {
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

bool int8_kernels_available() {
  return kernels::int8_variant() != kernels::Int8Variant::kScalar || fbgemm_exact();
}

bool lower_int8_quantize(const Node& n, Lowering& l) {
  const std::optional<Grid> g = uint8_grid(n);
  if (!g || !int8_kernels_available()) return false;
  const Grid grid = *g;
  l.add_step(n, "int8 quantize", [grid](std::vector<Value>& frame, const Step& s) {
    at::Tensor x = frame[s.inputs[0]].tensor();
    if (x.scalar_type() == at::kFloat && (x.dim() == 4 || x.dim() == 2) && x.is_contiguous()) {
      // NCHW floats to channels-last codes in one pass.
      const int64_t N = x.size(0), C = x.size(1), HW = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
      at::Tensor q = at::_empty_affine_quantized(x.sizes(), at::TensorOptions().dtype(at::kQUInt8), grid.scale,
                                                 grid.zero_point,
                                                 x.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
      kernels::int8_quantize_channels_last(x.data_ptr<float>(), N, C, HW, static_cast<float>(grid.scale),
                                           static_cast<int32_t>(grid.zero_point), grid.relu,
                                           reinterpret_cast<uint8_t*>(q.data_ptr<c10::quint8>()));
      frame[s.outputs[0]] = Value::of_quantized(q);
      return;
    }
    if (grid.relu) x = at::relu(x);
    if (x.dim() == 4) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    frame[s.outputs[0]] = Value::of_quantized(at::quantize_per_tensor(x, grid.scale, grid.zero_point, at::kQUInt8));
  });
  l.set_form(n.outputs[0], int8_form(grid));
  return true;
}

// The step of a layer on uint8 codes whose output no quantizer reads (a classifier's logits): the
// int8 kernel with float output, float(a)·s_x·s_w + b, where the generic step would compute the
// float layer on the dequantized codes and weights (the same values to float rounding).
static bool lower_int8_layer_to_float(const Node& n, Lowering& l, size_t rank) {
  std::shared_ptr<const kernels::Int8Conv2d> k = own_kernel(n);
  if (!k) return false;
  const Form& in = l.form(n.inputs[0]);
  auto r = std::make_shared<const kernels::Int8Conv2d::Requantization>(
      k->dequantization(static_cast<float>(in.int8_scale), static_cast<int32_t>(in.int8_zero_point)));
  const std::string name = n.name;
  l.add_step(n, "int8 " + n.op + " (float output)", [k, r, rank, name](std::vector<Value>& frame, const Step& s) {
    const at::Tensor& codes = codes_of(frame[s.inputs[0]]);
    if (static_cast<size_t>(codes.dim()) != rank || codes.size(1) != k->shape().in_channels)
      throw Error(name + ": int8 layer of " + std::to_string(k->shape().in_channels) + " input channels got codes of shape " +
                  shape_str(codes.sizes().vec()));
    const at::Tensor x = rank == 4 ? codes.contiguous(at::MemoryFormat::ChannelsLast) : codes.contiguous();
    const int64_t N = x.size(0), H = rank == 4 ? x.size(2) : 1, W = rank == 4 ? x.size(3) : 1;
    const int64_t O = k->shape().out_channels;
    at::Tensor y = rank == 4 ? at::empty({N, O, k->shape().out_h(H), k->shape().out_w(W)},
                                         at::TensorOptions().dtype(at::kFloat).memory_format(at::MemoryFormat::ChannelsLast))
                             : at::empty({N, O}, at::kFloat);
    const kernels::Int8Conv2d::Requantization own =
        static_cast<float>(x.q_scale()) == r->x_scale && x.q_zero_point() == r->x_zero_point
            ? *r
            : k->dequantization(static_cast<float>(x.q_scale()), static_cast<int32_t>(x.q_zero_point()));
    k->run(bytes_of(x), N, H, W, own, y.data_ptr<float>());
    frame[s.outputs[0]] = Value::of_tensor(y);
  });
  return true;
}

bool lower_int8_layer(const Node& n, Lowering& l) {
  if (!l.form(n.inputs.at(0)).int8 || n.inputs.size() != 1) return false;
  if (n.op != "conv2d" && n.op != "linear") return false;
  const size_t rank = n.op == "conv2d" ? 4 : 2;
  if (l.graph().value(n.inputs[0]).shape.size() != rank) return false;
  const Node* q = quantizer_reading(l, n.outputs.at(0));
  if (!q) return lower_int8_layer_to_float(n, l, rank);
  const Grid out = *uint8_grid(*q);
  std::string kernel;
  std::function<at::Tensor(const at::Tensor&)> apply;
  if (std::shared_ptr<const kernels::Int8Conv2d> k = own_kernel(n)) {
    const int64_t O = k->shape().out_channels;
    // The requantization from the input's grid, which the plan knows, to the quantizer's.
    const Form& in = l.form(n.inputs[0]);
    auto r = std::make_shared<const kernels::Int8Conv2d::Requantization>(
        k->requantization(static_cast<float>(in.int8_scale), static_cast<int32_t>(in.int8_zero_point),
                          static_cast<float>(out.scale), static_cast<int32_t>(out.zero_point), out.relu));
    const std::string name = n.name;
    apply = [k, r, out, O, rank, name](const at::Tensor& codes) {
      if (static_cast<size_t>(codes.dim()) != rank || codes.size(1) != k->shape().in_channels)
        throw Error(name + ": int8 layer of " + std::to_string(k->shape().in_channels) + " input channels got codes of shape " +
                    shape_str(codes.sizes().vec()));
      const at::Tensor x = rank == 4 ? codes.contiguous(at::MemoryFormat::ChannelsLast) : codes.contiguous();
      const int64_t N = x.size(0), H = rank == 4 ? x.size(2) : 1, W = rank == 4 ? x.size(3) : 1;
      const std::vector<int64_t> sizes =
          rank == 4 ? std::vector<int64_t>{N, O, k->shape().out_h(H), k->shape().out_w(W)} : std::vector<int64_t>{N, O};
      at::Tensor y = at::_empty_affine_quantized(sizes, at::TensorOptions().dtype(at::kQUInt8), out.scale, out.zero_point,
                                                 rank == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
      uint8_t* y_codes = reinterpret_cast<uint8_t*>(y.data_ptr<c10::quint8>());
      if (static_cast<float>(x.q_scale()) == r->x_scale && x.q_zero_point() == r->x_zero_point)
        k->run(bytes_of(x), N, H, W, *r, y_codes);
      else  // codes on another grid than the plan's (not made by this plan's steps)
        k->run(bytes_of(x), N, H, W, static_cast<float>(x.q_scale()), static_cast<int32_t>(x.q_zero_point()), y_codes,
               static_cast<float>(out.scale), static_cast<int32_t>(out.zero_point), out.relu);
      return y;
    };
    kernel = "int8 " + n.op;
  } else if (n.op == "conv2d" && fbgemm_exact()) {
    const std::optional<at::Tensor> weight = int8_weight(n);
    if (!weight) return false;
    const std::optional<c10::IValue> packed =
        prepack("quantized::conv2d_prepack", {*weight, bias_of(n), n.attr_pair("stride"), n.attr_pair("padding"),
                                              n.attr_pair("dilation"), n.attr_int("groups")});
    if (!packed) return false;
    auto p = packed->toCustomClass<ConvPackedParamsBase<2>>();
    apply = [p, out](const at::Tensor& x) { return out.relu ? p->apply_relu(x, out.scale, out.zero_point)
                                                             : p->apply(x, out.scale, out.zero_point); };
    kernel = "int8 conv2d (fbgemm)";
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
  if (kernels::int8_variant() == kernels::Int8Variant::kScalar) return false;
  const Node* q = quantizer_reading(l, n.outputs.at(0));
  if (!q) return false;
  const Grid out = *uint8_grid(*q);
  const Shape& a = l.graph().value(n.inputs[0]).shape;
  if (a != l.graph().value(n.inputs[1]).shape) return false;  // the kernel does not broadcast
  const at::MemoryFormat format = a.size() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  Step& step = l.add_step(n, "int8 add + requantize", [out, format](std::vector<Value>& frame, const Step& s) {
    const at::Tensor x = codes_of(frame[s.inputs[0]]).contiguous(format);
    const at::Tensor y = codes_of(frame[s.inputs[1]]).contiguous(format);
    if (!x.sizes().equals(y.sizes()))
      throw Error("int8 add: the inputs' shapes " + shape_str(x.sizes().vec()) + " and " + shape_str(y.sizes().vec()) +
                  " differ");
    at::Tensor z = at::_empty_affine_quantized(x.sizes(), at::TensorOptions().dtype(at::kQUInt8), out.scale,
                                               out.zero_point, format);
    kernels::int8_add(bytes_of(x), static_cast<float>(x.q_scale()), static_cast<int32_t>(x.q_zero_point()), bytes_of(y),
                      static_cast<float>(y.q_scale()), static_cast<int32_t>(y.q_zero_point()),
                      reinterpret_cast<uint8_t*>(z.data_ptr<c10::quint8>()), static_cast<float>(out.scale),
                      static_cast<int32_t>(out.zero_point), out.relu, x.numel());
    frame[s.outputs[0]] = Value::of_quantized(z);
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
