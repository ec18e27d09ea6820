#pragma once
// The deploy runtime's plan builder: what an op's lowering (deploy_lowerings(), by op kind) sees
// while deploy::Model turns a fused deploy graph into steps.
//
// A value of a deploy run is a float tensor, the packed signs of a ±1 tensor (kernels/bitpack.h's
// channel-last words), or both, each made from the other on first use. While lowering, each
// graph value has a Form saying what is known of it: whether it holds only ±1 (so its packed
// signs are exact), and whether its words are those of a feature map although the value is the
// map's flatten. A hook reads the forms of its node's inputs, adds a step, and sets the forms of
// its outputs; a node whose hook declines (or that has none) gets the generic step: the op's
// forward through ATen, with its weight decoded to float once, when the plan is built.

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/registry.h"
#include "graph/graph.h"
#include "kernels/binary_conv.h"
#include "kernels/bitplane.h"
#include "quantize/quantize.h"

namespace whittle::deploy {

/// One tensor during a deploy run (see the top of this file).
class Value {
 public:
  Value() = default;
  /// A float tensor (NCHW, [N, F], any shape).
  static Value of_tensor(at::Tensor tensor);
  /// The packed signs `words`, int64 [N, H, W, ⌈C/64⌉] or [N, ⌈C/64⌉], of a ±1 tensor with
  /// `channels` channels. `flattened`: the value is the [N, C·H·W] flatten of the NCHW map the
  /// rank-4 words encode.
  static Value of_words(at::Tensor words, int64_t channels, bool flattened = false);
  bool defined() const { return tensor_.defined() || words_.defined() || quantized_.defined(); }
  /// The float tensor; for packed signs, the ±1 tensor they encode, for integer codes their
  /// dequantized values (made on first use).
  const at::Tensor& tensor();
  /// The packed signs: pack_signs of the float tensor on first use (exact for a ±1 tensor; the
  /// sign binarizer's output for any other). Throws whittle::Error for a float tensor of a rank
  /// other than 2 or 4.
  const at::Tensor& words();
  /// Integer codes: a quantized tensor (uint8 per tensor, as LibTorch's quantized CPU engine takes
  /// it; NCHW maps in channels-last memory) on the grid of the affine quantizer that made it.
  static Value of_quantized(at::Tensor codes);
  /// The quantized tensor of of_quantized() (undefined otherwise).
  const at::Tensor& quantized() const { return quantized_; }
  /// True when the value holds packed words already (no packing needed).
  bool has_words() const { return words_.defined(); }
  /// True when the words encode a map whose flatten the value is.
  bool flattened() const { return flattened_; }
  /// The bit-planes (kernels::pack_bitplanes) of the DoReFa activation codes round(v/clip·(2^bits − 1))
  /// of a float tensor holding such values (Form::code_bits), made on first use.
  const at::Tensor& planes(int64_t bits, double clip);

 private:
  at::Tensor tensor_, words_, planes_, quantized_;
  int64_t channels_ = 0;
  bool flattened_ = false;
};

/// What the plan knows of a graph value while it is built.
struct Form {
  bool signs = false;  ///< the value holds only −1 and +1 (a binarizer's output, or max pooling of one)
  /// The value is the flatten [N, C·H·W] of a ±1 map whose packed words [N, H, W, ⌈C/64⌉] the
  /// run holds (flatten of packed signs moves no data); `map` is [C, H, W].
  bool packed_map = false;
  Shape map;
  /// > 0: the value holds DoReFa activation values clip·a/(2^code_bits − 1) with integer codes a
  /// (an act_quant output, or max pooling of one), so the bit-plane kernels may read its codes.
  int64_t code_bits = 0;
  double code_clip = 1.0;
  /// The value holds uint8 codes q of x = (q − int8_zero_point)·int8_scale (Value::of_quantized):
  /// an int8 quantizer's output, or an int8 layer's requantized to its consumer's grid.
  bool int8 = false;
  double int8_scale = 0.0;
  int64_t int8_zero_point = 0;
};

/// A packed layer's quantization and its integer codes (int64, the weight's shape [O, C, kh, kw]
/// or [O, C]).
struct PackedCodes {
  quantize::WeightQuantization q;
  at::Tensor codes;
};
/// The packed codes of `n`; nullopt for a node without packed codes or with another output-channel
/// axis than 0.
std::optional<PackedCodes> packed_codes(const Node& n);

/// A binary or bit-plane convolution or linear layer of the plan (kernels/binary_conv.h,
/// kernels/bitplane.h).
struct BinaryLayer {
  kernels::PackedBinaryWeight weight;  ///< the binary kinds' weight
  /// The bit-plane kinds' weight, and the DoReFa activation bits and clip of their input.
  std::shared_ptr<kernels::PackedBitplaneWeight> bitplane;
  int64_t activation_bits = 0;
  double activation_clip = 1.0;
  kernels::BinaryConv2dOptions options;
  kernels::BinaryEpilogue epilogue;
  /// kLinear: binary_linear on [N, ⌈C/64⌉] words; kConv: binary_conv2d on [N, H, W, ⌈C/64⌉];
  /// kLinearOnMap: a linear layer reading the flatten of a packed map, run as a convolution whose
  /// kernel covers the whole map (its output [N, O, 1, 1] viewed as [N, O]); kBitplaneConv:
  /// bitplane_conv2d on the input's activation planes (float output only).
  enum class Kind { kConv, kLinear, kLinearOnMap, kBitplaneConv } kind = Kind::kConv;
  /// kLinearOnMap: the map [C, H, W] whose flatten the layer reads (checked at run time).
  Shape map;
  /// O, from whichever weight the kind uses.
  int64_t out_channels() const { return bitplane ? bitplane->out_channels : weight.out_channels; }
};

/// One step of the plan: it reads the frame's slots `inputs` and writes `outputs`.
struct Step {
  std::vector<std::string> nodes;  ///< the graph nodes it computes (several when fused)
  std::string kernel;              ///< what runs: "binary_conv2d + threshold", "aten conv2d", ...
  std::vector<size_t> inputs, outputs;
  std::function<void(std::vector<Value>& frame, const Step& step)> run;
  std::shared_ptr<BinaryLayer> binary;  ///< set for binary layer steps (threshold fusion edits it)
};

/// The plan under construction, as the hooks see it.
class Lowering {
 public:
  /// `graph` must outlive the lowering; `use_kernels` false makes every hook decline. Room for
  /// one step per node is reserved, so a Step& or Step* stays valid while the plan is built
  /// (a node adds at most one step, or joins an earlier one).
  Lowering(const Graph& graph, bool use_kernels);

  const Graph& graph() const { return graph_; }
  /// False when the model runs in float throughout (deploy::Options::use_kernels).
  bool use_kernels() const { return use_kernels_; }
  /// The form of value `name` (float unless a hook said otherwise).
  const Form& form(const std::string& name) const;
  void set_form(const std::string& name, Form form);
  /// The frame slot of value `name` (allocated on first request).
  size_t slot(const std::string& name);

  /// Appends a step computing `node` (its inputs' and outputs' slots filled in). Throws
  /// whittle::Error when the steps would outnumber the graph's nodes.
  Step& add_step(const Node& node, std::string kernel, std::function<void(std::vector<Value>&, const Step&)> run);
  /// Appends the generic step of `node`: its op's forward through ATen on float tensors, with the
  /// weight its transform stack gives in eval mode (decoded now, once). Outputs are float; an op
  /// that commutes with sign (OpTraits::commutes_with_sign) keeps its input's ±1 form.
  Step& add_generic_step(const Node& node);
  /// Appends a binary layer step for `node` reading its input 0 (a BinaryLayer of kind kConv
  /// needs a ±1 map input, kLinear a ±1 [N, C] one, kLinearOnMap a packed map).
  Step& add_binary_step(const Node& node, BinaryLayer layer);
  /// The binary layer step that writes `value` when `consumer` is the value's only user and the
  /// value is no graph output, so the consumer may fold into the step's epilogue; else nullptr.
  Step* fusable_binary_producer(const std::string& value, const Node& consumer);
  /// Makes `step` compute `consumer` too: the consumer joins its nodes and its outputs become the
  /// consumer's (the caller has folded the consumer into the step, e.g. into its epilogue). A
  /// consumer later in graph order than the node being lowered gets no step of its own.
  void absorb(Step& step, const Node& consumer);
  /// True when absorb() made a step compute node `name`.
  bool absorbed(const std::string& name) const { return absorbed_.count(name) > 0; }

  /// The steps built so far.
  std::vector<Step>& steps() { return steps_; }
  size_t num_slots() const { return slots_.size(); }

 private:
  const Graph& graph_;
  bool use_kernels_;
  std::map<std::string, Form> forms_;
  std::map<std::string, size_t> slots_;
  std::map<size_t, size_t> writer_;  // slot → index of the step writing it
  std::set<std::string> absorbed_;   // nodes absorb() gave to a step
  std::vector<Step> steps_;
};

class Lowering;
/// Lowers one node into the plan: adds the steps that run it with bitpacked kernels when its
/// inputs and weights allow (a binary convolution reading packed signs), and returns false to
/// leave the node to the runtime's generic step (the op's forward through ATen, with its weight
/// decoded once at load).
using DeployLowerFn = std::function<bool(const Node& node, Lowering& lowering)>;

/// The deploy runtime's lowerings by op kind ("lowerings" in `whittle inspect`); an op without
/// one always takes the generic step.
Registry<DeployLowerFn>& deploy_lowerings();

/// Registers deploy's lowerings (conv2d, linear, batch_norm, max_pool2d, flatten, act_quant, add,
/// threshold_sign); idempotent, thread-safe. deploy::Model calls it.
void register_all();

}  // namespace whittle::deploy
