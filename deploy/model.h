#pragma once
// whittle::deploy::Model: runs a compressed model in its deploy form with the bitpacked kernels
// (docs/kernels.md, "Deploy runtime").
//
// From a checkpoint or a graph it builds the deploy form (export/deploy.h: QAT BN folded), fuses
// it for inference (fuse/fuse.h: BN folded into float layers, BN + sign binarizer → threshold),
// packs the quantized weights (quantize::pack_graph), and lowers each node through its registry
// hook (deploy/lowering.h):
//   - a binary layer (conv2d or linear whose packed weight is a sign code: BNN, XNOR-Net, DoReFa
//     1-bit) reading ±1 activations runs kernels::binary_conv2d / binary_linear on packed words,
//     with its α scale and bias in the epilogue, a following inference batch norm folded into that
//     epilogue, and a following threshold_sign folded in, so that it writes the next binary
//     layer's packed input directly;
//   - a bit-plane layer (conv2d whose packed weight is DoReFa k-bit, 1-bit or TWN ternary)
//     reading DoReFa-quantized activations runs kernels::bitplane_conv2d on the bit-planes of the
//     activation codes, when weight planes × activation planes ≤ 4 (W2A2, TWN with 2-bit
//     activations, W1A2...), the layer has at least 64 input channels and the CPU has AVX-512
//     VPOPCNTDQ (more pairs, narrower layers or AVX2's lookup popcount are slower than the float
//     convolution; so are linear layers), with a following batch norm folded into its epilogue;
//   - the sign binarizer packs its input (pack_signs); max pooling of packed signs is an AND of
//     words; flatten of packed signs moves nothing (the next linear layer reads the map);
//   - everything else runs its op's forward through ATen (oneDNN for float convolutions).
// Packed layers keep their weights packed: they are never decoded to float. Layers that are not
// (the float first and last layers, TWN with float activations, DoReFa W8A8 and W4A4) run
// through ATen with their weight decoded once, when the model is built.

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace whittle::deploy {

/// How the model runs.
struct Options {
  /// Run binary and bit-plane layers with the bitpacked kernels (default). false: every node
  /// through ATen in float, the reference `whittle bench` compares against.
  bool use_kernels = true;
};

/// One step of the model, for reports.
struct StepInfo {
  std::vector<std::string> nodes;  ///< the graph nodes it computes (a binary layer and its threshold)
  std::string kernel;              ///< what runs ("binary_conv2d + threshold", "pack_signs", "aten conv2d")
};

/// A compressed model ready for inference on the CPU. Copies share the plan; forward is const and
/// may run from several threads at once.
class Model {
 public:
  /// Builds the model from `graph` (a trained, a QAT or a loaded packed graph, on any device; not
  /// modified) as described at the top of this file; its tensors are copied to the CPU. Throws
  /// whittle::Error naming the node when the graph does not validate, a pass rejects it, or a
  /// packed layer's codes or scales are inconsistent.
  explicit Model(const Graph& graph, const Options& options = {});
  /// Loads a whittle checkpoint (export/checkpoint.h) and builds the model. Throws whittle::Error
  /// naming the path for a missing, corrupt or newer-format file.
  static Model load(const std::string& checkpoint_path, const Options& options = {});

  /// Runs the model on float CPU inputs (graph input order; any batch size) and returns its
  /// outputs as float tensors. With `step_seconds`, also the wall time of each step (steps()
  /// order). Throws whittle::Error for a wrong number of inputs or a CUDA tensor, and what a
  /// step throws (shape mismatches name the node).
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs, std::vector<double>* step_seconds = nullptr) const;
  /// The single-input, single-output form; throws whittle::Error for a graph with several.
  at::Tensor forward(const at::Tensor& input) const;

  /// The fused, packed graph the model runs.
  const Graph& graph() const;
  /// The steps in run order.
  std::vector<StepInfo> steps() const;
  /// Number of steps that run a packed layer (binary or bit-plane kernels).
  int64_t num_packed_layers() const;

 private:
  struct Plan;
  std::shared_ptr<const Plan> plan_;
};

}  // namespace whittle::deploy
