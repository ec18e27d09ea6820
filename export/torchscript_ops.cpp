// The TorchScript forms of the built-in, quantize and fuse ops: each op's
// TorchScript exporter's form (writers.h). Every statement calls the ATen operator whittle's eval forward
// calls (graph/ops.cpp, quantize/quantizers.cpp, fuse/fold_math.cpp) with the same arguments, in
// the same order of operations, so the exported module computes bitwise the same outputs.

#include <ATen/ATen.h>

#include "core/error.h"
#include "export/torchscript_export.h"
#include "export/writers.h"
#include "graph/op_registry.h"
#include "quantize/method.h"

namespace whittle::detail {

namespace {

using E = TorchScriptEmitter;

void attach(const std::string& kind, TorchScriptWriteFn fn) { torchscript_forms().add(kind, std::move(fn)); }

std::string in(const Node& n, E& e, size_t i = 0) { return e.var(n.inputs.at(i)); }
std::string out(const Node& n, E& e, size_t i = 0) { return e.var(n.outputs.at(i)); }

// y = <call>(x<, rest>): the common one-input form.
void call(const std::string& kind, const std::string& fn, std::function<std::string(const Node&)> rest = {}) {
  attach(kind, [fn, rest](const Node& n, E& e) {
    e.line(out(n, e) + " = " + fn + "(" + in(n, e) + (rest ? ", " + rest(n) : std::string()) + ")");
  });
}

void alias(const std::string& kind) {
  attach(kind, [](const Node& n, E& e) { e.line(out(n, e) + " = " + in(n, e)); });
}

// where(cond, +1, −1) in the input's dtype and device, as bnn_sign and apply_sign_threshold.
std::string plus_minus_one(const std::string& cond, const std::string& like) {
  return "torch.where(" + cond + ", torch.ones([], dtype=" + like + ".dtype, device=" + like + ".device), torch.full([], -1.0, dtype=" +
         like + ".dtype, device=" + like + ".device))";
}

void attach_layers() {
  attach("conv2d", [](const Node& n, E& e) {
    const std::string w = e.weight(n), b = e.tensor(n, "bias");
    e.line(out(n, e) + " = torch.conv2d(" + in(n, e) + ", " + w + ", " + b + ", " + E::ints(n.attr_pair("stride")) + ", " +
           E::ints(n.attr_pair("padding")) + ", " + E::ints(n.attr_pair("dilation")) + ", " +
           std::to_string(n.attr_int("groups")) + ")");
  });
  attach("conv_transpose2d", [](const Node& n, E& e) {
    const std::string w = e.weight(n), b = e.tensor(n, "bias");
    e.line(out(n, e) + " = torch.conv_transpose2d(" + in(n, e) + ", " + w + ", " + b + ", " + E::ints(n.attr_pair("stride")) +
           ", " + E::ints(n.attr_pair("padding")) + ", " + E::ints(n.attr_pair("output_padding")) + ", " +
           std::to_string(n.attr_int("groups")) + ", " + E::ints(n.attr_pair("dilation")) + ")");
  });
  attach("linear", [](const Node& n, E& e) {
    const std::string w = e.weight(n), b = e.tensor(n, "bias");
    e.line(out(n, e) + " = torch.linear(" + in(n, e) + ", " + w + ", " + b + ")");
  });
  attach("batch_norm", [](const Node& n, E& e) {
    // Eval form: running statistics, as batch_norm_forward(training = false).
    const std::string w = e.tensor(n, "weight"), b = e.tensor(n, "bias");
    const std::string m = e.tensor(n, "running_mean"), v = e.tensor(n, "running_var");
    e.line(out(n, e) + " = torch.batch_norm(" + in(n, e) + ", " + w + ", " + b + ", " + m + ", " + v + ", False, " +
           E::number(n.attr_float("momentum") < 0 ? 0.0 : n.attr_float("momentum")) + ", " +
           E::number(n.attr_float("eps")) + ", True)");
  });
}

void attach_activations() {
  attach("rprelu", [](const Node& n, E& e) {
    // As the forward: prelu(x − γ.view, β) + ζ.view, γ and ζ viewed as [1, C, 1, ...].
    const std::string x = in(n, e);
    std::string view = "[1, " + std::to_string(e.shape(n.inputs[0]).at(1));
    for (size_t i = 2; i < e.shape(n.inputs[0]).size(); ++i) view += ", 1";
    view += "]";
    e.line(out(n, e) + " = torch.prelu(" + x + " - torch.reshape(" + e.tensor(n, "shift_in") + ", " + view + "), " +
           e.tensor(n, "slope") + ") + torch.reshape(" + e.tensor(n, "shift_out") + ", " + view + ")");
  });
  call("relu", "torch.relu");
  call("relu6", "torch.hardtanh", [](const Node&) { return std::string("0.0, 6.0"); });
  call("leaky_relu", "torch.leaky_relu", [](const Node& n) { return E::number(n.attr_float("negative_slope")); });
  call("hardtanh", "torch.hardtanh", [](const Node& n) {
    return E::number(n.attr_float("min_val")) + ", " + E::number(n.attr_float("max_val"));
  });
  call("sigmoid", "torch.sigmoid");
  call("tanh", "torch.tanh");
  call("silu", "torch.silu");
  call("hardswish", "torch.hardswish");
  call("hardsigmoid", "torch.hardsigmoid");
  call("gelu", "torch.gelu", [](const Node& n) { return "approximate=\"" + n.attr_str("approximate") + "\""; });
  call("softmax", "torch.softmax", [](const Node& n) { return std::to_string(n.attr_int("dim")); });
  // Eval form: dropout is the identity.
  alias("dropout");
  alias("feature_dropout");
  alias("identity");
}

void attach_pooling() {
  attach("max_pool2d", [](const Node& n, E& e) {
    const auto k = n.attr_pair("kernel_size");
    e.line(out(n, e) + " = torch.max_pool2d(" + in(n, e) + ", " + E::ints(k) + ", " +
           E::ints(n.has_attr("stride") ? n.attr_pair("stride") : k) + ", " + E::ints(n.attr_pair("padding")) + ", " +
           E::ints(n.attr_pair("dilation")) + ", " + E::boolean(n.attr_bool("ceil_mode")) + ")");
  });
  attach("avg_pool2d", [](const Node& n, E& e) {
    const auto k = n.attr_pair("kernel_size");
    const int64_t div = n.attr_int("divisor_override");
    e.line(out(n, e) + " = torch.avg_pool2d(" + in(n, e) + ", " + E::ints(k) + ", " +
           E::ints(n.has_attr("stride") ? n.attr_pair("stride") : k) + ", " + E::ints(n.attr_pair("padding")) + ", " +
           E::boolean(n.attr_bool("ceil_mode")) + ", " + E::boolean(n.attr_bool("count_include_pad")) + ", " +
           (div > 0 ? std::to_string(div) : std::string("None")) + ")");
  });
  call("adaptive_avg_pool2d", "torch.adaptive_avg_pool2d", [](const Node& n) { return E::ints(n.attr_pair("output_size")); });
  attach("mean", [](const Node& n, E& e) {
    e.line(out(n, e) + " = torch.mean(" + in(n, e) + ", " + E::ints(n.attr_ints("dims")) + ", " +
           E::boolean(n.attr_bool("keepdim")) + ")");
  });
}

void attach_shape_ops() {
  attach("add", [](const Node& n, E& e) { e.line(out(n, e) + " = " + in(n, e, 0) + " + " + in(n, e, 1)); });
  attach("mul", [](const Node& n, E& e) { e.line(out(n, e) + " = " + in(n, e, 0) + " * " + in(n, e, 1)); });
  call("flatten", "torch.flatten",
       [](const Node& n) { return std::to_string(n.attr_int("start_dim")) + ", " + std::to_string(n.attr_int("end_dim")); });
  attach("reshape", [](const Node& n, E& e) {
    // [N, shape...] with the run's batch size.
    std::string dims = "[" + in(n, e) + ".size(0)";
    for (int64_t d : n.attr_ints("shape")) dims += ", " + std::to_string(d);
    e.line(out(n, e) + " = torch.reshape(" + in(n, e) + ", " + dims + "])");
  });
  attach("cat", [](const Node& n, E& e) {
    std::string list;
    for (size_t i = 0; i < n.inputs.size(); ++i) list += (i ? ", " : "") + in(n, e, i);
    e.line(out(n, e) + " = torch.cat([" + list + "], " + std::to_string(n.attr_int("dim")) + ")");
  });
  attach("split", [](const Node& n, E& e) {
    const std::string parts = e.temp(n.name + "_parts");
    e.line(parts + " = torch.split_with_sizes(" + in(n, e) + ", " + E::ints(n.attr_ints("split_sizes")) + ", " +
           std::to_string(n.attr_int("dim")) + ")");
    for (size_t i = 0; i < n.outputs.size(); ++i) e.line(out(n, e, i) + " = " + parts + "[" + std::to_string(i) + "]");
  });
  call("transpose", "torch.transpose",
       [](const Node& n) { return std::to_string(n.attr_int("dim0")) + ", " + std::to_string(n.attr_int("dim1")); });
  call("permute", "torch.permute", [](const Node& n) { return E::ints(n.attr_ints("dims")); });
  attach("channel_shuffle", [](const Node& n, E& e) {
    // x.reshape([N, g, C/g, ...]).transpose(1, 2).reshape(x.sizes()), as the op's forward.
    const std::string x = in(n, e), s = e.temp(n.name + "_sizes");
    const std::string g = std::to_string(n.attr_int("groups"));
    e.line(s + " = " + x + ".size()");
    e.line(out(n, e) + " = torch.reshape(torch.transpose(torch.reshape(" + x + ", [" + s + "[0], " + g + ", " + s + "[1] // " + g +
           "] + " + s + "[2:]), 1, 2), " + s + ")");
  });
  attach("upsample", [](const Node& n, E& e) {
    // The output size at the declared spatial size (only the batch dimension varies), and the
    // scale factors when given, as the op's forward passes them.
    const Shape& o = e.shape(n.outputs[0]);
    std::string sh = "None", sw = "None";
    if (!n.has_attr("size")) {
      std::vector<double> sf = n.attr_floats("scale_factor");
      sh = E::number(sf[0]);
      sw = E::number(sf.size() > 1 ? sf[1] : sf[0]);
    }
    const std::string size = E::ints({o[2], o[3]});
    const std::string mode = n.attr_str("mode");
    if (mode == "nearest")
      e.line(out(n, e) + " = torch.upsample_nearest2d(" + in(n, e) + ", " + size + ", " + sh + ", " + sw + ")");
    else if (mode == "bilinear")
      e.line(out(n, e) + " = torch.upsample_bilinear2d(" + in(n, e) + ", " + size + ", " +
             E::boolean(n.attr_bool("align_corners")) + ", " + sh + ", " + sw + ")");
    else
      e.unsupported(n, "upsample mode '" + mode + "'");
  });
}

void attach_quantized() {
  attach("act_quant", [](const Node& n, E& e) {
    // The node's activation quantizer gives its expression (bitwise its eval forward).
    quantize::TorchScriptTerms terms;
    terms.number = [](double v) { return E::number(v); };
    terms.tensor = [&](const std::string& name) { return e.tensor(n, name); };
    const std::string x = in(n, e);
    e.line(out(n, e) + " = " + quantize::activation_quantizer_of(n).torchscript(n, x, terms));
  });
  attach("xnor_scale", [](const Node& n, E& e) {
    const std::string x = in(n, e), y = out(n, e);
    if (e.shape(n.inputs[0]).size() == 2) return e.line(y + " = torch.mean(torch.abs(" + x + "), [1], True)");
    e.line(y + " = torch.avg_pool2d(torch.mean(torch.abs(" + x + "), [1], True), " + E::ints(n.attr_ints("kernel_size")) + ", " +
           E::ints(n.attr_ints("stride")) + ", " + E::ints(n.attr_ints("padding")) + ", False, True, None)");
  });
  attach("threshold_sign", [](const Node& n, E& e) {
    // apply_sign_threshold: +1 where (y − t)·d ≥ 0, t and d viewed as [1, C, 1, ...].
    const std::string x = in(n, e);
    const std::string t = e.tensor(n, "threshold"), d = e.tensor(n, "direction");
    std::string view = "[1, " + std::to_string(e.shape(n.inputs[0]).at(1));
    for (size_t i = 2; i < e.shape(n.inputs[0]).size(); ++i) view += ", 1";
    view += "]";
    const std::string tv = e.temp(n.name + "_threshold"), dv = e.temp(n.name + "_direction");
    e.line(tv + " = torch.reshape(" + t + ".to(" + x + ".dtype), " + view + ")");
    e.line(dv + " = torch.reshape(" + d + ".to(" + x + ".dtype), " + view + ")");
    e.line(out(n, e) + " = " + plus_minus_one("(" + x + " - " + tv + ") * " + dv + " >= 0", x));
  });
}

}  // namespace

void attach_torchscript_writers() {
  attach_layers();
  attach_activations();
  attach_pooling();
  attach_shape_ops();
  attach_quantized();
}

}  // namespace whittle::detail
