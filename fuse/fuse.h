#pragma once
// whittle::fuse: graph passes that make a trained network cheaper without changing what it
// computes (docs/fusion.md):
//   fold_batchnorm.h   BN folding into conv2d / conv_transpose2d / linear (inference), conv bias removal
//   qat_batchnorm.h    BN folding during quantization-aware training (conv_bn_qat)
//   bn_threshold.h     BN + sign binarizer → per-channel threshold (BNN / XNOR deploy form)
//   repvgg.h           RepVGG re-parameterization (3×3 + 1×1 + identity branches → one 3×3 conv)
//   fold_math.h        the arithmetic of all of them, as pure functions
// This header also holds the registration of fuse's ops and the all-in-one inference pipeline that
// `whittle fuse` and the fuse_batchnorm modifier run.

#include <string>
#include <vector>

#include "fuse/bn_threshold.h"
#include "fuse/fold_batchnorm.h"
#include "fuse/qat_batchnorm.h"
#include "fuse/repvgg.h"
#include "fuse/report.h"
#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::fuse {

/// Registers fuse's ops ("threshold_sign", "conv_bn_qat") and its weight transform ("bn_fold")
/// with the op registry (idempotent, thread-safe). The passes call it; call it yourself before
/// building a GraphModule from a graph that holds those ops by other means (a checkpoint reader).
void register_all();

/// Options of fuse_for_inference: which passes run, in this order.
struct InferenceOptions {
  bool finalize_qat = true;  ///< turn conv_bn_qat nodes into folded layers (default true)
  bool repvgg = true;        ///< RepVGG re-parameterization (default true)
  bool fold = true;          ///< BN folding into conv / transposed conv / linear (default true)
  bool threshold = true;     ///< BN + sign binarizer → threshold_sign (default true)
  /// BN nodes (and, for repvgg, root add nodes) to consider; empty: all. graph/select.h patterns.
  std::vector<std::string> targets;
  /// Patterns excluded from targets.
  std::vector<std::string> ignore;
};

/// Runs finalize_qat_batchnorm, reparameterize_repvgg, fold_batchnorm and fold_bn_into_threshold
/// as selected, on running statistics only, and returns their reports appended in order.
/// The result computes the same function as the input in eval mode (to float rounding).
/// Throws whittle::Error for an unknown plain target name.
Report fuse_for_inference(Graph& graph, const InferenceOptions& options = {});

/// The same on a module, then module->sync(). Throws whittle::Error when the module is in
/// training mode (call eval() first: fusion uses running statistics, never batch statistics).
Report fuse_for_inference(GraphModule& module, const InferenceOptions& options = {});

/// Number of batch_norm nodes whose input is produced by a conv2d / conv_transpose2d / linear
/// node with no other user (BNs fold_batchnorm could fold if the weights were plain).
int64_t count_foldable_batchnorm(const Graph& graph);

}  // namespace whittle::fuse
