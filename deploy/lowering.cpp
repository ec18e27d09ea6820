#include "deploy/lowering.h"

#include <ATen/ATen.h>

#include <mutex>

#include "core/error.h"
#include "graph/op_registry.h"
#include "kernels/bitpack.h"
#include "quantize/pack.h"
#include "quantize/quantize.h"

namespace whittle::deploy {

Value Value::of_tensor(at::Tensor tensor) {
  Value v;
  v.tensor_ = std::move(tensor);
  return v;
}

Value Value::of_words(at::Tensor words, int64_t channels, bool flattened) {
  Value v;
  v.words_ = std::move(words);
  v.channels_ = channels;
  v.flattened_ = flattened;
  return v;
}

const at::Tensor& Value::tensor() {
  if (!tensor_.defined() && quantized_.defined()) tensor_ = at::dequantize(quantized_);
  if (!tensor_.defined() && words_.defined()) {
    tensor_ = kernels::unpack_signs(words_, channels_);
    if (flattened_) tensor_ = tensor_.flatten(1);
  }
  return tensor_;
}

const at::Tensor& Value::words() {
  if (!words_.defined() && tensor_.defined()) {
    words_ = kernels::pack_signs(tensor_);
    channels_ = tensor_.size(1);
  }
  return words_;
}

const at::Tensor& Value::planes(int64_t bits, double clip) {
  if (!planes_.defined()) {
    const double levels = static_cast<double>((int64_t{1} << bits) - 1);
    planes_ = kernels::pack_bitplanes(at::round(tensor() / clip * levels), bits);
  }
  return planes_;
}

std::optional<PackedCodes> packed_codes(const Node& n) {
  if (n.weight_transforms != std::vector<std::string>{"packed"}) return std::nullopt;
  auto q = quantize::weight_quantization(n);
  if (!q || q->axis != 0) return std::nullopt;
  const std::vector<int64_t> shape = n.attr_ints("weight_shape");
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  at::Tensor codes = quantize::unpack_codes(n.buffers.at("weight_codes"), quantize::storage_bits(q->bits), count);
  return PackedCodes{std::move(*q), codes.to(at::kLong).reshape(shape)};
}

Value Value::of_quantized(at::Tensor codes) {
  Value v;
  v.quantized_ = std::move(codes);
  return v;
}

Lowering::Lowering(const Graph& graph, bool use_kernels) : graph_(graph), use_kernels_(use_kernels) {
  steps_.reserve(graph.nodes().size());
}

const Form& Lowering::form(const std::string& name) const {
  static const Form kFloat;
  auto it = forms_.find(name);
  return it == forms_.end() ? kFloat : it->second;
}

void Lowering::set_form(const std::string& name, Form form) { forms_[name] = std::move(form); }

size_t Lowering::slot(const std::string& name) {
  auto it = slots_.find(name);
  if (it != slots_.end()) return it->second;
  const size_t s = slots_.size();
  slots_.emplace(name, s);
  return s;
}

Step& Lowering::add_step(const Node& node, std::string kernel, std::function<void(std::vector<Value>&, const Step&)> run) {
  if (steps_.size() == steps_.capacity())
    throw Error("deploy: more steps than the graph's " + std::to_string(graph_.nodes().size()) +
                " nodes (a lowering hook added two for node '" + node.name + "')");
  Step step;
  step.nodes = {node.name};
  step.kernel = std::move(kernel);
  for (const std::string& v : node.inputs) step.inputs.push_back(slot(v));
  for (const std::string& v : node.outputs) step.outputs.push_back(slot(v));
  step.run = std::move(run);
  for (size_t s : step.outputs) writer_[s] = steps_.size();
  steps_.push_back(std::move(step));
  return steps_.back();
}

Step& Lowering::add_generic_step(const Node& node) {
  const OpTraits* traits = &op_traits(node.op);
  if (!traits->forward) throw Error("deploy: node '" + node.name + "' (" + node.op + ") has no forward");
  // The op runs with the weight its transform stack gives in eval mode, computed once here.
  auto shadow = std::make_shared<Node>(node);
  if (!node.weight_transforms.empty()) {
    shadow->params.set("weight", transformed_weight(node, false).detach());
    shadow->weight_transforms.clear();
  }
  Step& step = add_step(node, "aten " + node.op, [shadow, traits](std::vector<Value>& frame, const Step& s) {
    std::vector<at::Tensor> in;
    in.reserve(s.inputs.size());
    for (size_t i : s.inputs) in.push_back(frame[i].tensor());
    std::vector<at::Tensor> out = traits->forward(*shadow, in, false);
    if (out.size() != s.outputs.size())
      throw Error("deploy: node '" + shadow->name + "' returned " + std::to_string(out.size()) + " outputs, expected " +
                  std::to_string(s.outputs.size()));
    for (size_t i = 0; i < out.size(); ++i) frame[s.outputs[i]] = Value::of_tensor(std::move(out[i]));
  });
  // Max pooling, flatten, dropout and identity keep ±1 values ±1 and DoReFa codes on their grid.
  if (traits->commutes_with_sign && node.inputs.size() == 1 && node.outputs.size() == 1) {
    const Form in = form(node.inputs[0]);
    if (in.signs || in.code_bits > 0) set_form(node.outputs[0], Form{in.signs, false, {}, in.code_bits, in.code_clip});
  }
  return step;
}

namespace {

// Runs one binary layer on its input value.
Value run_binary_layer(const BinaryLayer& b, Value& input) {
  const bool sign_out = b.epilogue.threshold.defined();
  const int64_t O = b.out_channels();
  switch (b.kind) {
    case BinaryLayer::Kind::kConv: {
      at::Tensor y = kernels::binary_conv2d(input.words(), b.weight, b.options, b.epilogue);
      return sign_out ? Value::of_words(std::move(y), O) : Value::of_tensor(std::move(y));
    }
    case BinaryLayer::Kind::kLinear: {
      at::Tensor y = kernels::binary_linear(input.words(), b.weight, b.epilogue);
      return sign_out ? Value::of_words(std::move(y), O) : Value::of_tensor(std::move(y));
    }
    case BinaryLayer::Kind::kLinearOnMap: {
      const at::Tensor& words = input.words();
      if (words.dim() != 4 || words.size(1) != b.map[1] || words.size(2) != b.map[2])
        throw Error("the linear layer takes the flatten of a [" + std::to_string(b.map[0]) + ", " +
                    std::to_string(b.map[1]) + ", " + std::to_string(b.map[2]) + "] map (" +
                    std::to_string(b.map[0] * b.map[1] * b.map[2]) + " features), got a map of " +
                    (words.dim() == 4 ? std::to_string(words.size(1)) + "x" + std::to_string(words.size(2))
                                      : std::string("another rank")));
      at::Tensor y = kernels::binary_conv2d(words, b.weight, b.options, b.epilogue);
      const int64_t N = words.size(0);
      return sign_out ? Value::of_words(y.reshape({N, y.size(-1)}), O) : Value::of_tensor(y.reshape({N, O}));
    }
    case BinaryLayer::Kind::kBitplaneConv:
      return Value::of_tensor(kernels::bitplane_conv2d(input.planes(b.activation_bits, b.activation_clip), *b.bitplane,
                                                       b.options, b.epilogue));

  }
  throw Error("deploy: unknown binary layer kind");
}

const char* binary_kernel_name(BinaryLayer::Kind kind) {
  switch (kind) {
    case BinaryLayer::Kind::kConv: return "binary_conv2d";
    case BinaryLayer::Kind::kLinear: return "binary_linear";
    case BinaryLayer::Kind::kLinearOnMap: return "binary_linear (as a convolution over the map)";
    case BinaryLayer::Kind::kBitplaneConv: return "bitplane_conv2d";
  }
  return "binary";
}

}  // namespace

Step& Lowering::add_binary_step(const Node& node, BinaryLayer layer) {
  auto b = std::make_shared<BinaryLayer>(std::move(layer));
  std::string name = binary_kernel_name(b->kind);
  if (b->bitplane)
    name += " (" + std::to_string(b->bitplane->planes.size()) + " weight x " + std::to_string(b->activation_bits) +
            " activation planes)";
  Step& step = add_step(node, std::move(name), [b](std::vector<Value>& frame, const Step& s) {
    frame[s.outputs[0]] = run_binary_layer(*b, frame[s.inputs[0]]);
  });
  step.binary = b;
  return step;
}

Step* Lowering::fusable_binary_producer(const std::string& value, const Node& consumer) {
  if (graph_.is_output(value) || graph_.users(value) != std::vector<std::string>{consumer.name}) return nullptr;
  auto s = slots_.find(value);
  if (s == slots_.end()) return nullptr;
  auto w = writer_.find(s->second);
  if (w == writer_.end()) return nullptr;
  Step& step = steps_[w->second];
  if (!step.binary || step.outputs.size() != 1 || step.outputs[0] != s->second) return nullptr;
  return &step;
}

void Lowering::absorb(Step& step, const Node& consumer) {
  absorbed_.insert(consumer.name);
  step.nodes.push_back(consumer.name);
  step.outputs.clear();
  const size_t index = static_cast<size_t>(&step - steps_.data());
  for (const std::string& v : consumer.outputs) {
    step.outputs.push_back(slot(v));
    writer_[step.outputs.back()] = index;
  }
}

}  // namespace whittle::deploy
