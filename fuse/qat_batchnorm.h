#pragma once
// BN folding during quantization-aware training (Jacob et al. 2018, "Quantization and Training
// of Neural Networks for Efficient Integer-Arithmetic-Only Inference", sec. 3.2 and fig. C.8;
// Krishnamoorthi 2018, "Quantizing deep convolutional networks for efficient inference", sec. 3.2).
//
// A conv2d / conv_transpose2d / linear layer followed by a BN becomes one `conv_bn_qat` node whose
// weight is the folded weight W·s, s = γ/σ_running (σ = √(σ² + ε)), so that a weight quantizer on
// the layer sees — and rounds — exactly the weight the deployed layer will have. On every forward:
//   training, statistics not frozen:  z = layer(x, q(W·s)) / s + b;  y = BN_batch(z)
//     i.e. y = layer(x, q(W·s))·σ_running/σ_batch + (b − μ_batch)·γ/σ_batch + β: batch statistics
//     with the σ_running/σ_batch correction; the running statistics are updated as a BN does;
//   eval, or statistics frozen:       y = layer(x, q(W·s)) + β + (b − μ_running)·s
//     (the deployed layer, bit for bit the same as after finalize_qat_batchnorm).
// q is the layer's own weight transform (a quantizer attached by quantize/ before this pass) or
// the identity.
//
// The node keeps the layer's name, attributes and `weight` / `bias` and takes the BN's tensors as
// params `bn_weight`, `bn_bias` and buffers `bn_running_mean`, `bn_running_var`,
// `bn_num_batches_tracked`; attributes `base_op` (the layer's op), `bn_eps`, `bn_momentum`,
// `bn_frozen` (0/1); the weight transform "bn_fold" (W·γ/σ) joins the layer's stack before its
// quantizer, so the quantizer sees the folded weight ([mask,] bn_fold[, quantizer]).

#include <string>
#include <vector>

#include "fuse/report.h"
#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::fuse {

/// Options of prepare_qat_batchnorm.
struct QatOptions {
  /// BN nodes to fold (graph/select.h patterns). Default empty: every batch_norm node.
  std::vector<std::string> targets;
  /// Patterns excluded from targets. Default empty.
  std::vector<std::string> ignore;
};

/// Rewrites each qualifying layer → BN pair into a `conv_bn_qat` node (see above). Qualifies as
/// fold_batchnorm does, except that a weight transform on the layer is allowed (and kept, applied
/// to the folded weight); a packed weight is not. Run it after quantize::apply, so the quantizers
/// are already on the layers. Skipped pairs are reported.
Report prepare_qat_batchnorm(Graph& graph, const QatOptions& options = {});
/// The same on a module, then module->sync(); rebuild the optimizer afterwards (the BN parameters
/// moved to the layer nodes).
Report prepare_qat_batchnorm(GraphModule& module, const QatOptions& options = {});

/// Freezes the BN statistics of every conv_bn_qat node: from now on training uses the running
/// statistics (the folded inference form) and no longer updates them. Returns how many nodes
/// changed. Call module->sync() afterwards when the graph belongs to a module.
int64_t freeze_qat_batchnorm(Graph& graph);

/// Turns every conv_bn_qat node back into its base op holding the folded weight W·s and bias
/// β + (b − μ)·s, "bn_fold" taken off its stack (the quantizer, if any, stays). The
/// result computes what the conv_bn_qat node computes in eval mode, and has no BN left; quantized
/// checkpoints then store the folded weight's codes.
Report finalize_qat_batchnorm(Graph& graph);
/// The same on a module, then module->sync(); rebuild the optimizer afterwards.
Report finalize_qat_batchnorm(GraphModule& module);

}  // namespace whittle::fuse
