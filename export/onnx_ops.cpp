// The ONNX forms of the built-in, quantize and fuse ops: the ONNX exporter's per-op forms (writers.h).
// docs/export.md has the table; attribute conventions are those of graph/ops.cpp.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "export/onnx.h"
#include "export/writers.h"
#include "graph/op_registry.h"
#include "quantize/method.h"

namespace whittle::detail {

namespace {

using A = OnnxEmitter::Attribute;

int64_t wrap(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }

std::vector<int64_t> pads4(const std::vector<int64_t>& p) { return {p[0], p[1], p[0], p[1]}; }

// The weight's shape: its parameter's, or a packed node's recorded weight_shape.
std::vector<int64_t> weight_shape(const Node& n) {
  if (const at::Tensor* w = n.params.find("weight"); w && w->defined()) return w->sizes().vec();
  return n.attr_ints("weight_shape");
}

void attach(const std::string& kind, OnnxWriteFn fn) { onnx_forms().add(kind, std::move(fn)); }

// One ONNX op with the node's input and output, no attributes.
void same(const std::string& kind, const std::string& onnx_op) {
  attach(kind, [onnx_op](const Node& n, OnnxEmitter& e) { e.node(n, onnx_op, {n.inputs[0]}, {n.outputs[0]}); });
}

void clip(const Node& n, OnnxEmitter& e, const std::string& x, const std::string& out, float lo, float hi,
          const std::string& part = "") {
  e.node(n, "Clip", {x, e.scalar(n, part.empty() ? "min" : part + "_min", lo), e.scalar(n, part.empty() ? "max" : part + "_max", hi)},
         {out}, {}, part);
}

// x·hardsigmoid(x) with HardSigmoid(alpha = 1/6, beta = 1/2) = relu6(x + 3)/6.
void hard_sigmoid(const Node& n, OnnxEmitter& e, const std::string& x, const std::string& out, const std::string& part) {
  e.node(n, "HardSigmoid", {x}, {out}, {A::of("alpha", 1.0f / 6.0f), A::of("beta", 0.5f)}, part);
}

void attach_layers() {
  attach("conv2d", [](const Node& n, OnnxEmitter& e) {
    const std::vector<int64_t> w = weight_shape(n);
    std::vector<std::string> in{n.inputs[0], e.weight(n, 0)};
    if (std::string b = e.tensor(n, "bias"); !b.empty()) in.push_back(b);
    e.node(n, "Conv", in, {n.outputs[0]},
           {A::of("kernel_shape", std::vector<int64_t>{w[2], w[3]}), A::of("strides", n.attr_pair("stride")),
            A::of("pads", pads4(n.attr_pair("padding"))), A::of("dilations", n.attr_pair("dilation")),
            A::of("group", n.attr_int("groups"))});
  });
  attach("conv_transpose2d", [](const Node& n, OnnxEmitter& e) {
    const std::vector<int64_t> w = weight_shape(n);
    const auto s = n.attr_pair("stride"), p = n.attr_pair("padding");
    std::vector<int64_t> op = n.attr_pair("output_padding"), pads = pads4(p);
    // PyTorch allows output_padding < max(stride, dilation), onnxruntime only < stride. The output
    // is the full result cropped by p at the start and p − output_padding at the end, so with
    // p ≥ output_padding the end padding says the same.
    for (int i = 0; i < 2; ++i)
      if (op[i] >= s[i]) {
        if (p[i] < op[i]) e.unsupported(n, "output_padding ≥ stride with padding < output_padding");
        pads[2 + i] -= op[i];
        op[i] = 0;
      }
    std::vector<std::string> in{n.inputs[0], e.weight(n, 1)};
    if (std::string b = e.tensor(n, "bias"); !b.empty()) in.push_back(b);
    e.node(n, "ConvTranspose", in, {n.outputs[0]},
           {A::of("kernel_shape", std::vector<int64_t>{w[2], w[3]}), A::of("strides", s), A::of("pads", pads),
            A::of("dilations", n.attr_pair("dilation")), A::of("output_padding", op), A::of("group", n.attr_int("groups"))});
  });
  attach("linear", [](const Node& n, OnnxEmitter& e) {
    const std::string w = e.weight(n, 0);
    const std::string b = e.tensor(n, "bias");
    if (e.shape(n.inputs[0]).size() == 2) {
      std::vector<std::string> in{n.inputs[0], w};
      if (!b.empty()) in.push_back(b);
      e.node(n, "Gemm", in, {n.outputs[0]}, {A::of("transB", int64_t{1})});
      return;
    }
    // [..., in] · Wᵀ (+ b) for inputs of another rank.
    const std::string wt = e.temp(n, "weight_t");
    e.node(n, "Transpose", {w}, {wt}, {A::of("perm", std::vector<int64_t>{1, 0})}, "weight_t");
    if (b.empty()) {
      e.node(n, "MatMul", {n.inputs[0], wt}, {n.outputs[0]});
      return;
    }
    const std::string mm = e.temp(n, "matmul");
    e.node(n, "MatMul", {n.inputs[0], wt}, {mm}, {}, "matmul");
    e.node(n, "Add", {mm, b}, {n.outputs[0]});
  });
  attach("batch_norm", [](const Node& n, OnnxEmitter& e) {
    const int64_t c = e.shape(n.inputs[0]).at(1);
    std::string scale = e.tensor(n, "weight");
    if (scale.empty()) scale = e.initializer(n, "weight", at::ones({c}));
    std::string bias = e.tensor(n, "bias");
    if (bias.empty()) bias = e.initializer(n, "bias", at::zeros({c}));
    e.node(n, "BatchNormalization", {n.inputs[0], scale, bias, e.tensor(n, "running_mean"), e.tensor(n, "running_var")},
           {n.outputs[0]}, {A::of("epsilon", static_cast<float>(n.attr_float("eps")))});
  });
}

void attach_activations() {
  same("relu", "Relu");
  same("sigmoid", "Sigmoid");
  same("tanh", "Tanh");
  same("identity", "Identity");
  same("dropout", "Identity");  // eval form
  same("feature_dropout", "Identity");
  attach("relu6", [](const Node& n, OnnxEmitter& e) { clip(n, e, n.inputs[0], n.outputs[0], 0.0f, 6.0f); });
  attach("hardtanh", [](const Node& n, OnnxEmitter& e) {
    clip(n, e, n.inputs[0], n.outputs[0], static_cast<float>(n.attr_float("min_val")),
         static_cast<float>(n.attr_float("max_val")));
  });
  attach("leaky_relu", [](const Node& n, OnnxEmitter& e) {
    e.node(n, "LeakyRelu", {n.inputs[0]}, {n.outputs[0]},
           {A::of("alpha", static_cast<float>(n.attr_float("negative_slope")))});
  });
  attach("rprelu", [](const Node& n, OnnxEmitter& e) {
    // PRelu(x − γ; β) + ζ with γ, β, ζ as [C, 1, ...] initializers (broadcast over the rest).
    std::vector<int64_t> view = e.shape(n.inputs[0]);
    view.erase(view.begin());
    std::fill(view.begin() + 1, view.end(), 1);
    auto shaped = [&](const char* name) {
      return e.initializer(n, name, at::reshape(n.params.at(name).detach().to(at::kFloat), view));
    };
    const std::string centered = e.temp(n, "centered"), activated = e.temp(n, "prelu");
    e.node(n, "Sub", {n.inputs[0], shaped("shift_in")}, {centered}, {}, "shift_in");
    e.node(n, "PRelu", {centered, shaped("slope")}, {activated}, {}, "prelu");
    e.node(n, "Add", {activated, shaped("shift_out")}, {n.outputs[0]});
  });
  attach("silu", [](const Node& n, OnnxEmitter& e) {
    const std::string s = e.temp(n, "sigmoid");
    e.node(n, "Sigmoid", {n.inputs[0]}, {s}, {}, "sigmoid");
    e.node(n, "Mul", {n.inputs[0], s}, {n.outputs[0]});
  });
  attach("hardsigmoid", [](const Node& n, OnnxEmitter& e) { hard_sigmoid(n, e, n.inputs[0], n.outputs[0], ""); });
  attach("hardswish", [](const Node& n, OnnxEmitter& e) {
    if (e.opset() >= 14) return e.node(n, "HardSwish", {n.inputs[0]}, {n.outputs[0]});
    const std::string s = e.temp(n, "hardsigmoid");
    hard_sigmoid(n, e, n.inputs[0], s, "hardsigmoid");
    e.node(n, "Mul", {n.inputs[0], s}, {n.outputs[0]});
  });
  attach("gelu", [](const Node& n, OnnxEmitter& e) {
    const std::string x = n.inputs[0];
    const std::string mode = n.attr_str("approximate");
    std::string inner;
    if (mode == "none") {  // x·(1 + erf(x/√2))/2
      const std::string d = e.temp(n, "scaled");
      inner = e.temp(n, "erf");
      e.node(n, "Mul", {x, e.scalar(n, "inv_sqrt2", static_cast<float>(1.0 / std::sqrt(2.0)))}, {d}, {}, "scale");
      e.node(n, "Erf", {d}, {inner}, {}, "erf");
    } else if (mode == "tanh") {  // x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))/2
      const std::string x3 = e.temp(n, "cube"), c = e.temp(n, "cubic"), s = e.temp(n, "sum"), a = e.temp(n, "arg");
      inner = e.temp(n, "tanh");
      e.node(n, "Pow", {x, e.scalar(n, "three", 3.0f)}, {x3}, {}, "cube");
      e.node(n, "Mul", {x3, e.scalar(n, "coefficient", 0.044715f)}, {c}, {}, "cubic");
      e.node(n, "Add", {x, c}, {s}, {}, "sum");
      e.node(n, "Mul", {s, e.scalar(n, "sqrt_2_over_pi", static_cast<float>(std::sqrt(2.0 / M_PI)))}, {a}, {}, "arg");
      e.node(n, "Tanh", {a}, {inner}, {}, "tanh");
    } else {
      e.unsupported(n, "approximate='" + mode + "'");
    }
    const std::string p = e.temp(n, "one_plus"), h = e.temp(n, "half");
    e.node(n, "Add", {inner, e.scalar(n, "one", 1.0f)}, {p}, {}, "one_plus");
    e.node(n, "Mul", {x, e.scalar(n, "half", 0.5f)}, {h}, {}, "half");
    e.node(n, "Mul", {h, p}, {n.outputs[0]});
  });
  attach("softmax", [](const Node& n, OnnxEmitter& e) {
    e.node(n, "Softmax", {n.inputs[0]}, {n.outputs[0]}, {A::of("axis", n.attr_int("dim"))});
  });
}

// PyTorch's pooled size, recomputed here: with ceil_mode a last window starting in the padding is
// dropped, a rule ONNX's ceil_mode does not have.
int64_t pooled(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t num = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

void attach_pooling() {
  attach("max_pool2d", [](const Node& n, OnnxEmitter& e) {
    const auto k = n.attr_pair("kernel_size");
    const auto s = n.has_attr("stride") ? n.attr_pair("stride") : k;
    const auto p = n.attr_pair("padding");
    const auto d = n.attr_pair("dilation");
    const bool ceil_mode = n.attr_bool("ceil_mode");
    const Shape& in = e.shape(n.inputs[0]);
    // ceil_mode: ONNX's own when its sizes are PyTorch's (no last window starting in the padding);
    // otherwise floor mode with the end padding the last window needs (padding never wins a max),
    // which ONNX allows while the padding stays below the kernel size.
    std::vector<int64_t> pads = pads4(p);
    bool onnx_ceil = ceil_mode, padded = ceil_mode;
    std::vector<int64_t> extra = pads;
    for (int i = 0; ceil_mode && i < 2; ++i) {
      const int64_t want = pooled(in[2 + i], k[i], s[i], p[i], d[i], true);
      const int64_t span = d[i] * (k[i] - 1) + 1;
      onnx_ceil = onnx_ceil && (in[2 + i] + 2 * p[i] - span + s[i] - 1) / s[i] + 1 == want;
      extra[2 + i] += std::max<int64_t>(0, (want - 1) * s[i] + span - (in[2 + i] + 2 * p[i]));
      padded = padded && extra[2 + i] < k[i];
    }
    if (ceil_mode && !onnx_ceil) {
      if (!padded) e.unsupported(n, "ceil_mode whose last window needs end padding ≥ the kernel size");
      pads = extra;
    }
    e.node(n, "MaxPool", {n.inputs[0]}, {n.outputs[0]},
           {A::of("kernel_shape", k), A::of("strides", s), A::of("pads", pads), A::of("dilations", d),
            A::of("ceil_mode", int64_t{onnx_ceil ? 1 : 0})});
  });
  attach("avg_pool2d", [](const Node& n, OnnxEmitter& e) {
    const auto k = n.attr_pair("kernel_size");
    const auto s = n.has_attr("stride") ? n.attr_pair("stride") : k;
    const auto p = n.attr_pair("padding");
    const bool ceil_mode = n.attr_bool("ceil_mode");
    if (n.attr_int("divisor_override") > 0) e.unsupported(n, "divisor_override");
    const Shape& in = e.shape(n.inputs[0]);
    const Shape& out = e.shape(n.outputs[0]);
    if (ceil_mode)
      for (int i = 0; i < 2; ++i) {
        const int64_t onnx_out = (in[2 + i] + 2 * p[i] - k[i] + s[i] - 1) / s[i] + 1;
        if (onnx_out != out[2 + i]) e.unsupported(n, "ceil_mode with a last window starting in the padding");
      }
    e.node(n, "AveragePool", {n.inputs[0]}, {n.outputs[0]},
           {A::of("kernel_shape", k), A::of("strides", s), A::of("pads", pads4(p)),
            A::of("ceil_mode", int64_t{ceil_mode ? 1 : 0}), A::of("count_include_pad", n.attr_int("count_include_pad"))});
  });
  attach("adaptive_avg_pool2d", [](const Node& n, OnnxEmitter& e) {
    const Shape& in = e.shape(n.inputs[0]);
    const Shape& out = e.shape(n.outputs[0]);
    if (out[2] == 1 && out[3] == 1) return e.node(n, "GlobalAveragePool", {n.inputs[0]}, {n.outputs[0]});
    if (in[2] % out[2] || in[3] % out[3])
      e.unsupported(n, "adaptive pooling from " + shape_str({in[2], in[3]}) + " to " + shape_str({out[2], out[3]}) +
                           " (sizes that do not divide)");
    const std::vector<int64_t> k{in[2] / out[2], in[3] / out[3]};
    e.node(n, "AveragePool", {n.inputs[0]}, {n.outputs[0]}, {A::of("kernel_shape", k), A::of("strides", k)});
  });
  attach("mean", [](const Node& n, OnnxEmitter& e) {
    e.node(n, "ReduceMean", {n.inputs[0]}, {n.outputs[0]},
           {A::of("axes", n.attr_ints("dims")), A::of("keepdims", n.attr_int("keepdim"))});
  });
}

void attach_shape_ops() {
  attach("add", [](const Node& n, OnnxEmitter& e) { e.node(n, "Add", {n.inputs[0], n.inputs[1]}, {n.outputs[0]}); });
  attach("mul", [](const Node& n, OnnxEmitter& e) { e.node(n, "Mul", {n.inputs[0], n.inputs[1]}, {n.outputs[0]}); });
  attach("flatten", [](const Node& n, OnnxEmitter& e) {
    const Shape& in = e.shape(n.inputs[0]);
    const int64_t s = wrap(n.attr_int("start_dim"), in.size());
    const int64_t end = wrap(n.attr_int("end_dim"), in.size());
    if (s == 1 && end == static_cast<int64_t>(in.size()) - 1)
      return e.node(n, "Flatten", {n.inputs[0]}, {n.outputs[0]}, {A::of("axis", int64_t{1})});
    // Dims before start_dim copied (0), the merged ones inferred (-1), later ones as declared.
    std::vector<int64_t> shape(static_cast<size_t>(s), 0);
    shape.push_back(-1);
    for (size_t i = static_cast<size_t>(end) + 1; i < in.size(); ++i) shape.push_back(in[i]);
    e.node(n, "Reshape", {n.inputs[0], e.ints(n, "shape", shape)}, {n.outputs[0]});
  });
  attach("reshape", [](const Node& n, OnnxEmitter& e) {
    std::vector<int64_t> shape{0};  // the batch dimension is kept
    for (int64_t d : n.attr_ints("shape")) {
      if (d == 0) e.unsupported(n, "a 0 in 'shape' (ONNX reads it as 'copy the input dim')");
      shape.push_back(d);
    }
    e.node(n, "Reshape", {n.inputs[0], e.ints(n, "shape", shape)}, {n.outputs[0]});
  });
  attach("cat", [](const Node& n, OnnxEmitter& e) {
    e.node(n, "Concat", n.inputs, {n.outputs[0]}, {A::of("axis", n.attr_int("dim"))});
  });
  attach("split", [](const Node& n, OnnxEmitter& e) {
    e.node(n, "Split", {n.inputs[0], e.ints(n, "split", n.attr_ints("split_sizes"))}, n.outputs,
           {A::of("axis", n.attr_int("dim"))});
  });
  attach("transpose", [](const Node& n, OnnxEmitter& e) {
    const size_t rank = e.shape(n.inputs[0]).size();
    std::vector<int64_t> perm(rank);
    for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[static_cast<size_t>(wrap(n.attr_int("dim0"), rank))], perm[static_cast<size_t>(wrap(n.attr_int("dim1"), rank))]);
    e.node(n, "Transpose", {n.inputs[0]}, {n.outputs[0]}, {A::of("perm", perm)});
  });
  attach("permute", [](const Node& n, OnnxEmitter& e) {
    const size_t rank = e.shape(n.inputs[0]).size();
    std::vector<int64_t> perm;
    for (int64_t d : n.attr_ints("dims")) perm.push_back(wrap(d, rank));
    e.node(n, "Transpose", {n.inputs[0]}, {n.outputs[0]}, {A::of("perm", perm)});
  });
  attach("channel_shuffle", [](const Node& n, OnnxEmitter& e) {
    // [N, C, ...] → [N, g, C/g, ...] → swap dims 1 and 2 → [N, C, ...].
    const Shape& in = e.shape(n.inputs[0]);
    const int64_t g = n.attr_int("groups");
    std::vector<int64_t> split{0, g, in[1] / g}, back{0, in[1]}, perm{0, 2, 1};
    for (size_t i = 2; i < in.size(); ++i) {
      split.push_back(in[i]);
      back.push_back(in[i]);
      perm.push_back(static_cast<int64_t>(i) + 1);
    }
    const std::string a = e.temp(n, "grouped"), b = e.temp(n, "swapped");
    e.node(n, "Reshape", {n.inputs[0], e.ints(n, "grouped_shape", split)}, {a}, {}, "group");
    e.node(n, "Transpose", {a}, {b}, {A::of("perm", perm)}, "swap");
    e.node(n, "Reshape", {b, e.ints(n, "shape", back)}, {n.outputs[0]});
  });
  attach("upsample", [](const Node& n, OnnxEmitter& e) {
    const Shape& in = e.shape(n.inputs[0]);
    const Shape& out = e.shape(n.outputs[0]);
    std::vector<double> sf;
    if (!n.has_attr("size")) {
      sf = n.attr_floats("scale_factor");
      if (sf.size() == 1) sf.push_back(sf[0]);
    }
    const std::string mode = n.attr_str("mode");
    if (mode == "nearest") {
      // PyTorch's source index min(floor(i·scale), in − 1) in float, scale = 1/scale_factor or
      // in/out: two Gathers with those indices, exact (Resize's nearest rounds some ratios otherwise).
      std::string x = n.inputs[0];
      for (int axis = 0; axis < 2; ++axis) {
        const float scale = sf.empty() ? static_cast<float>(in[2 + axis]) / static_cast<float>(out[2 + axis])
                                       : static_cast<float>(1.0 / sf[static_cast<size_t>(axis)]);
        std::vector<int64_t> index;
        for (int64_t i = 0; i < out[2 + axis]; ++i)
          index.push_back(std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), in[2 + axis] - 1));
        const std::string y = axis == 0 ? e.temp(n, "rows") : n.outputs[0];
        e.node(n, "Gather", {x, e.ints(n, axis == 0 ? "row_index" : "column_index", index)}, {y},
               {A::of("axis", int64_t{2 + axis})}, axis == 0 ? "rows" : "");
        x = y;
      }
      return;
    }
    // Bilinear: half_pixel (pytorch_half_pixel differs from PyTorch for an output length of 1).
    const bool align = n.attr_bool("align_corners");
    const std::vector<A> attrs{A::of("mode", std::string("linear")),
                               A::of("coordinate_transformation_mode", std::string(align ? "align_corners" : "half_pixel"))};
    if (!sf.empty()) {  // scale_factor: PyTorch maps coordinates with the factor itself
      // The float factor, nudged by ulps until ONNX's floor(in·scale) in float is whittle's size.
      std::vector<float> scales{1.0f, 1.0f};
      for (int axis = 0; axis < 2; ++axis) {
        float f = static_cast<float>(sf[static_cast<size_t>(axis)]);
        for (int step = 0; step < 64; ++step) {
          const auto got = static_cast<int64_t>(std::floor(static_cast<float>(in[2 + axis]) * f));
          if (got == out[2 + axis]) break;
          f = std::nextafter(f, got < out[2 + axis] ? std::numeric_limits<float>::infinity() : 0.0f);
        }
        scales.push_back(f);
      }
      return e.node(n, "Resize", {n.inputs[0], "", e.initializer(n, "scales", at::tensor(scales))}, {n.outputs[0]}, attrs);
    }
    // sizes = [N, C] of the input (the batch may vary) ++ the requested [h, w].
    const std::string shp = e.temp(n, "input_shape"), nc = e.temp(n, "batch_channels"), sizes = e.temp(n, "sizes");
    e.node(n, "Shape", {n.inputs[0]}, {shp}, {}, "shape");
    e.node(n, "Slice", {shp, e.ints(n, "slice_start", {0}), e.ints(n, "slice_end", {2})}, {nc}, {}, "batch_channels");
    e.node(n, "Concat", {nc, e.ints(n, "size", {out[2], out[3]})}, {sizes}, {A::of("axis", int64_t{0})}, "sizes");
    e.node(n, "Resize", {n.inputs[0], "", "", sizes}, {n.outputs[0]}, attrs);
  });
}

// The quantize and fuse ops.
void attach_quantized() {
  attach("act_quant", [](const Node& n, OnnxEmitter& e) {
    // The form follows the grid the node's activation quantizer puts its outputs on.
    const quantize::ActivationGrid g = quantize::activation_quantizer_of(n).grid(n);
    if (g.sign) {
      // RSign: the sign of x − β, β [C] as a [C, 1, ...] initializer.
      const OpTraits& traits = op_traits(n.op);
      const at::Tensor shift = traits.sign_shift ? traits.sign_shift(n) : at::Tensor();
      if (!shift.defined()) return e.sign_plus_one(n, n.inputs[0], n.outputs[0], "");
      std::vector<int64_t> view = e.shape(n.inputs[0]);
      view.erase(view.begin());
      std::fill(view.begin() + 1, view.end(), 1);
      const std::string centered = e.temp(n, "centered");
      e.node(n, "Sub", {n.inputs[0], e.initializer(n, "shift", at::reshape(shift.detach().to(at::kFloat).cpu(), view))},
             {centered}, {}, "shift");
      return e.sign_plus_one(n, centered, n.outputs[0], "");
    }
    // relu: the quantizer stands for a ReLU then itself (same values below 32 bits).
    if (g.bits == 32) return e.node(n, g.relu ? "Relu" : "Identity", {n.inputs[0]}, {n.outputs[0]});
    if (g.bits < 1 || g.bits > 8) e.unsupported(n, "an activation grid of " + std::to_string(g.bits) + " bits");
    if (g.affine) {
      // (clamp(round(x/s) + z, a_min, a_max) − z)·s is QuantizeLinear then DequantizeLinear with
      // that zero point (uint8, or int8 for signed codes), which saturate at the code range: only
      // 8-bit grids are written so (ONNX's integer types).
      if (g.bits != 8) e.unsupported(n, "an affine activation grid of " + std::to_string(g.bits) + " bits");
      std::string x = n.inputs[0];
      // On uint8 codes with zero point 0, QuantizeLinear saturates every negative input at code 0
      // as a ReLU before it would: the ReLU is left out (the Q/DQ pattern runtimes fuse).
      if (g.relu && (g.signed_codes || g.zero_point != 0)) {
        const std::string r = e.temp(n, "relu");
        e.node(n, "Relu", {x}, {r}, {}, "relu");
        x = r;
      }
      const std::string scale = e.scalar(n, "scale", static_cast<float>(g.max / 255.0));
      const std::string zp = e.initializer(n, "zero_point", g.signed_codes ? at::full({}, g.zero_point, at::kChar)
                                                                           : at::full({}, g.zero_point, at::kByte));
      const std::string q = e.temp(n, "quantized");
      e.node(n, "QuantizeLinear", {x, scale, zp}, {q}, {}, "quantize");
      return e.node(n, "DequantizeLinear", {q, scale, zp}, {n.outputs[0]});
    }
    // c·round(clip(x, 0, c)/c·(2^k − 1))/(2^k − 1) = DequantizeLinear(QuantizeLinear(clip(x, 0, c))) with
    // scale c/(2^k − 1), uint8 codes 0..2^k − 1, zero point 0. QuantizeLinear saturates at 255, so
    // 8 bits need no Clip.
    const double c = g.max;
    const double levels = static_cast<double>((int64_t{1} << g.bits) - 1);
    std::string x = n.inputs[0];
    // A grid shifted by β (LSQ+): DequantizeLinear(QuantizeLinear(clip(x − β, 0, c))) + β.
    const bool shifted = g.offset != 0.0;
    const std::string offset = shifted ? e.scalar(n, "offset", static_cast<float>(g.offset)) : "";
    if (shifted) {
      const std::string sub = e.temp(n, "shifted");
      e.node(n, "Sub", {x, offset}, {sub}, {}, "shift");
      x = sub;
    }
    if (g.bits < 8) {
      const std::string clipped = e.temp(n, "clipped");
      clip(n, e, x, clipped, 0.0f, static_cast<float>(c), "clip");
      x = clipped;
    }
    const std::string scale = e.scalar(n, "scale", static_cast<float>(c / levels));
    const std::string zp = e.initializer(n, "zero_point", at::zeros({}, at::kByte));
    const std::string q = e.temp(n, "quantized");
    e.node(n, "QuantizeLinear", {x, scale, zp}, {q}, {}, "quantize");
    if (!shifted) return e.node(n, "DequantizeLinear", {q, scale, zp}, {n.outputs[0]});
    const std::string dq = e.temp(n, "dequantized");
    e.node(n, "DequantizeLinear", {q, scale, zp}, {dq}, {}, "dequantize");
    e.node(n, "Add", {dq, offset}, {n.outputs[0]}, {}, "unshift");
  });
  attach("xnor_scale", [](const Node& n, OnnxEmitter& e) {
    // K = avg_pool(mean_c |x|) over the layer's window; mean_f |x| for features.
    const bool features = e.shape(n.inputs[0]).size() == 2;
    const std::string a = e.temp(n, "abs"), m = features ? n.outputs[0] : e.temp(n, "channel_mean");
    e.node(n, "Abs", {n.inputs[0]}, {a}, {}, "abs");
    e.node(n, "ReduceMean", {a}, {m}, {A::of("axes", std::vector<int64_t>{1}), A::of("keepdims", int64_t{1})},
           features ? "" : "channel_mean");
    if (features) return;
    e.node(n, "AveragePool", {m}, {n.outputs[0]},
           {A::of("kernel_shape", n.attr_ints("kernel_size")), A::of("strides", n.attr_ints("stride")),
            A::of("pads", pads4(n.attr_ints("padding"))), A::of("count_include_pad", int64_t{1})});
  });
  attach("threshold_sign", [](const Node& n, OnnxEmitter& e) {
    // +1 where direction·(x − threshold) ≥ 0, per channel.
    const Shape& in = e.shape(n.inputs[0]);
    std::vector<int64_t> view(in.size(), 1);
    view[1] = in[1];
    const std::string t = e.initializer(n, "threshold", n.buffers.at("threshold").to(at::kFloat).reshape(view));
    const std::string d = e.initializer(n, "direction", n.buffers.at("direction").to(at::kFloat).reshape(view));
    const std::string diff = e.temp(n, "difference"), z = e.temp(n, "directed");
    e.node(n, "Sub", {n.inputs[0], t}, {diff}, {}, "difference");
    e.node(n, "Mul", {diff, d}, {z}, {}, "directed");
    e.sign_plus_one(n, z, n.outputs[0], "");
  });
}

}  // namespace

void attach_onnx_writers() {
  attach_layers();
  attach_activations();
  attach_pooling();
  attach_shape_ops();
  attach_quantized();
}

}  // namespace whittle::detail
