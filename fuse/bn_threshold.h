#pragma once
// BN → threshold for binary activations: a batch_norm followed by the sign binarizer becomes one
// per-channel comparison with a threshold (the deploy form of BNN / XNOR-Net models, where the
// BN's multiply-adds disappear).

#include <string>
#include <vector>

#include "fuse/report.h"
#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::fuse {

/// Options of fold_bn_into_threshold.
struct ThresholdOptions {
  /// BN nodes to consider (graph/select.h patterns). Default empty: every batch_norm node.
  std::vector<std::string> targets;
  /// Patterns excluded from targets. Default empty.
  std::vector<std::string> ignore;
};

/// Rewrites batch_norm → a sign binarizer (is_sign_binarizer: an act_quant whose quantizer outputs
/// sign(x), sign(0) = +1, as BNN's)
/// into one `threshold_sign` node reading the BN's input y:
///   sign(γ(y − μ)/σ + β) = +1 where y ≥ τ (γ > 0) or y ≤ τ (γ < 0), τ = μ − βσ/γ, σ = √(σ² + ε);
/// γ = 0 gives the constant sign(β) (+1 when β = 0). See bn_sign_threshold in fold_math.h.
/// The binarizer node keeps its name and output (downstream nodes are untouched) and holds the
/// buffers `threshold` and `direction` [C]; the BN node is removed. Uses running statistics only.
/// A BN whose output has other users or is a graph output is skipped and reported.
/// A binarizer with a learned threshold β (OpTraits::sign_shift: RSign, sign(x − β)) folds too:
/// with the BN before it into the threshold of a BN whose bias is β_BN − β, and without one (or
/// with a BN that cannot fold) into `threshold_sign` reading its own input, threshold β, direction
/// +1. `targets` and `ignore` select BN nodes; a lone RSign is always rewritten.
/// Example: conv2 → bn2 → act_quant(sign) → max_pool becomes conv2 → threshold_sign → max_pool.
Report fold_bn_into_threshold(Graph& graph, const ThresholdOptions& options = {});

/// fold_bn_into_threshold on a module's graph, then module->sync(). Throws whittle::Error when
/// the module is in training mode (call eval() first; the threshold bakes in running statistics).
Report fold_bn_into_threshold(GraphModule& module, const ThresholdOptions& options = {});

}  // namespace whittle::fuse
