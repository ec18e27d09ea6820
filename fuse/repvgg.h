#pragma once
// RepVGG structural re-parameterization (Ding et al. 2021, "RepVGG: Making VGG-style ConvNets
// Great Again", sec. 3.4): the training-time block
//   y = BN(conv3×3(x)) + BN(conv1×1(x)) + BN(x)      (the identity branch only when stride 1, C_in = C_out)
// becomes one 3×3 conv with bias that computes the same y.

#include <string>
#include <vector>

#include "fuse/report.h"
#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::fuse {

/// Options of reparameterize_repvgg.
struct RepvggOptions {
  /// Root `add` nodes of the blocks to merge (graph/select.h patterns). Default empty: every add.
  std::vector<std::string> targets;
  /// Patterns excluded from targets. Default empty.
  std::vector<std::string> ignore;
};

/// Finds sums (a tree of `add` nodes whose inner results have no other use) of two or more branches
/// that all read the same value x, where each branch is one of
///   conv2d(x) [→ batch_norm]        a k×k conv with padding (k−1)/2, dilation 1;
///   batch_norm(x)                   the identity branch with BN;
///   x                               the identity branch without BN;
/// with at least one conv branch, all convs sharing stride and groups, odd kernels, and identity
/// branches only where stride is 1 and the conv maps C channels to C. Each such sum becomes one
/// conv2d with the largest kernel K×K, padding (K−1)/2 and a bias: every branch is folded with its
/// BN (fold_conv_bn_params), 1×1 kernels are zero-padded to K×K, the identity is the kernel with 1
/// at [i, i mod (C/groups), K/2, K/2]; weights and biases add up. The new node is named
/// "<common prefix of the branch names>.rbr_reparam" (as the authors' deploy form, e.g.
/// "stage1.0.rbr_reparam") and replaces the root add's output; the branch nodes are removed.
/// Uses running statistics only. Sums that look like a block but do not qualify (a conv output with
/// other users, a weight transform, mismatched strides or groups, an identity branch beside a
/// strided conv) are skipped and reported; plain residual adds (ResNet) are not candidates and are
/// not reported. Applies to the zoo's repvgg_a0 and to imported models with the same pattern.
Report reparameterize_repvgg(Graph& graph, const RepvggOptions& options = {});

/// reparameterize_repvgg on a module's graph, then module->sync(). Throws whittle::Error when the
/// module is in training mode (call eval() first).
Report reparameterize_repvgg(GraphModule& module, const RepvggOptions& options = {});

}  // namespace whittle::fuse
