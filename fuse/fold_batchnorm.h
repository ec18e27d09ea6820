#pragma once
// Batch-norm folding for inference: conv2d / conv_transpose2d / linear followed by batch_norm
// becomes one layer with W' = W·γ/√(σ²+ε) and b' = β + (b − μ)·γ/√(σ²+ε) (fold_math.h), using
// the running statistics only. Also the pass that removes a layer bias feeding a BN.

#include <string>
#include <vector>

#include "fuse/report.h"
#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::fuse {

/// Options of fold_batchnorm and remove_bias_before_batchnorm.
struct FoldOptions {
  /// BN nodes to consider: node names, op kinds or "re:<regex>" (graph/select.h). Default empty:
  /// every batch_norm node.
  std::vector<std::string> targets;
  /// Patterns excluded from targets. Default empty.
  std::vector<std::string> ignore;
};

/// Folds every selected batch_norm node into the conv2d / conv_transpose2d / linear node that
/// produces its input, then removes the BN node (its users read the layer's output instead).
/// Conv2d may have any groups and dilation; conv_transpose2d scales weight axis 1 per group; a
/// linear layer folds with a BN over its 2-D output [N, features] (BatchNorm1d). The folded layer
/// always has a bias. Always uses running_mean / running_var, whatever the module's mode.
///
/// A BN is left as it is, and reported in `skipped` with the reason, when: its input is not produced
/// by one of those layers; the layer's output has other users or is a graph output; the layer's
/// weight is not a plain floating-point tensor (a weight transform such as a quantizer computes it,
/// or it is packed); the BN has no running statistics; or a linear output is not 2-D.
/// Example: conv1 → bn1 → relu becomes conv1 (with bias) → relu; report.fused = {"conv1 ← bn1"}.
/// Throws whittle::Error for an unknown plain target name (select_nodes).
Report fold_batchnorm(Graph& graph, const FoldOptions& options = {});

/// fold_batchnorm on a module's graph, then module->sync(). Throws whittle::Error when the
/// module is in training mode: folding bakes in the running statistics that eval() uses, so call
/// module->eval() first (a training-mode module would normalize with batch statistics).
Report fold_batchnorm(GraphModule& module, const FoldOptions& options = {});

/// Removes the bias b of a conv2d / conv_transpose2d / linear layer whose only user is a BN node,
/// absorbing it into the BN: running_mean becomes μ − b, which in eval mode equals β' = β + γ·b/σ
/// and in training mode is exact too (batch statistics subtract the mean, bias included), so
/// the output is unchanged in both modes. Skips (and reports) layers whose output has other users.
Report remove_bias_before_batchnorm(Graph& graph, const FoldOptions& options = {});

}  // namespace whittle::fuse
