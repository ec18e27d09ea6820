#pragma once
// whittle::prune: channel pruning on the graph IR (docs/pruning.md). Collect, then rewrite:
//   dependency_groups(graph)        the channels removed together (prune/groups.h)
//   score(graph, group, options)    per-channel importance of a group
//   make_plan(graph, config)        which channels go, for a ratio or a MACs/parameter target
//   remove_channels(graph, plan)    physical removal: sliced weights, biases, BN statistics,
//                                   `groups`; the removed channels' constant outputs folded
//                                   into the next layer's bias where that is exact
//   prune(module, config)           all of it on a GraphModule
// The result is a smaller Graph: no masks, no zeroed channels left behind.

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/options.h"
#include "graph/graph.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "prune/groups.h"

namespace whittle::prune {

/// How channels are ranked (docs/pruning.md): the lowest scores are removed first.
enum class Criterion {
  kL1,       ///< Σ|w| over the channel's slices of every member's `weight` (layer rows, consumer columns, BN γ)
  kL2,       ///< Σ w² over the same slices
  kBnScale,  ///< |γ| of the group's batch_norm members (network slimming, Liu et al. 2017); groups without BN are not pruned
  kFpgm,     ///< distance to the other filters, Σ_j ‖w_c − w_j‖₂ over the producers' filters (He et al. 2019)
  kTaylor,   ///< first-order Taylor, Σ|w·∂L/∂w| accumulated over batches (Molchanov et al. 2019; TaylorScores)
  kRandom,   ///< uniform random scores (a baseline), seeded
};

/// "l1", "l2", "bn_scale", "fpgm", "taylor", "random".
const char* criterion_name(Criterion c);
/// The criterion named `name`; throws whittle::Error (usage) listing the names.
Criterion criterion_from_name(const std::string& name);

/// Σ over batches of |w ⊙ ∂L/∂w| per parameter, for the Taylor criterion (Molchanov et al. 2019):
/// attach() installs a gradient hook on every `weight` parameter of the module's graph, and each
/// backward pass then adds |w ⊙ grad| (the weight's shape, on its device) to that weight's sum.
/// Keyed "node.param". The hooks hold their weights weakly (a weight freed by pruning takes its
/// hook with it), a second attach() replaces the hooks of the first (a weight hooked twice would
/// count twice), and the destructor removes them. Not copyable: one set of hooks, one owner.
class TaylorScores {
 public:
  TaylorScores() = default;
  TaylorScores(const TaylorScores&) = delete;
  TaylorScores& operator=(const TaylorScores&) = delete;
  ~TaylorScores();

  /// Hooks the module's current weights (call again after the parameter set changed); the hooks
  /// of an earlier attach() are removed first.
  void attach(GraphModule& module);
  /// Removes every hook this object installed (the sums stay).
  void detach();
  /// Clears the sums (the hooks stay).
  void reset();
  /// The sums; a node without one scores 0.
  const std::map<std::string, at::Tensor>& sums() const { return *sums_; }

 private:
  struct Hook;
  std::shared_ptr<std::map<std::string, at::Tensor>> sums_ = std::make_shared<std::map<std::string, at::Tensor>>();
  std::vector<std::shared_ptr<Hook>> hooks_;
};

/// Options of score().
struct ScoreOptions {
  Criterion criterion = Criterion::kL1;
  /// Reduce the members' contributions by their mean instead of their sum.
  bool mean_over_members = false;
  uint64_t seed = 0;                     ///< kRandom
  const TaylorScores* taylor = nullptr;  ///< kTaylor (required)
};

/// Per-channel importance of `group` (size group.channels; fixed channels get +∞), from the
/// graph's current tensors. Throws whittle::Error for kTaylor without scores.
std::vector<double> score(const Graph& graph, const DependencyGroup& group, const ScoreOptions& options);

/// What to prune and how much.
struct Config {
  ScoreOptions scoring;
  /// Fraction of each group's channels removed (per-group mode), or of all targeted channels
  /// (global mode); used when no target is set. [0, 1).
  double sparsity = 0.5;
  /// Keep this fraction of the unpruned model's MACs (0: no MACs target): the sparsity that
  /// reaches it is searched. (0, 1].
  double target_macs = 0;
  /// Keep this fraction of the parameters (0: none). (0, 1].
  double target_params = 0;
  /// Rank all targeted channels together (scores divided by their group's mean) instead of
  /// removing the same fraction from every group.
  bool global = false;
  /// Kept channels per group a multiple of this (hardware-friendly widths), ≥ 1.
  int64_t round_to = 1;
  /// No group, and no layer among a group's members, keeps fewer channels (a layer whose outputs
  /// are part of a larger group, as in a DenseNet block, keeps at least this many of its own;
  /// this takes precedence over round_to), ≥ 1.
  int64_t min_channels = 1;
  /// Groups are pruned when every producer member is selected by these (graph/select.h patterns;
  /// empty targets: every producer).
  std::vector<std::string> targets;
  std::vector<std::string> ignore;
  /// Fold removed channels' constant outputs into the next layers' biases where exact.
  bool fold_constant_outputs = true;
  /// A group whose channels are several layers' outputs side by side (a concatenation: each channel
  /// produced by one layer) removes from each layer its share of the group's count, ranked within
  /// that layer, so that every concatenated branch keeps the same fraction (as Torch-Pruning ranks
  /// per layer). false: one ranking over the whole group, which can take a branch down to
  /// min_channels (inception_v3's Mixed_6e.branch1x1 went from 192 channels to 1 at sparsity 0.3).
  bool rank_per_layer = true;
  /// Per layer (producer node name), its output channels before any pruning: a group whose first
  /// producer is listed keeps C₀ − ⌊sparsity·C₀⌋ channels of its original C₀ (so that steps of a
  /// schedule reach the final count without rounding drift). Unlisted groups use their current size.
  std::map<std::string, int64_t> original_channels;
};

/// Which channels of which groups go.
struct Plan {
  std::vector<DependencyGroup> groups;
  /// Per group (same order): the channel indices removed, ascending.
  std::vector<std::vector<int64_t>> remove;
  /// Groups left alone and why ("group 3 (fc3): fixed: graph output 'fc3'").
  std::vector<std::string> skipped;
  int64_t removed() const;  ///< channels removed in all
};

/// The plan for `config` on `graph`: groups, scores, and the lowest-scored channels of the
/// targeted groups, under min_channels, round_to and equal counts per grouped-convolution group.
/// With a MACs or parameter target, the sparsity that reaches it (bisection over trial removals)
/// is used. Throws whittle::Error (usage) for options out of range, an unknown target pattern,
/// or a target no plan reaches (naming the closest reached).
Plan make_plan(const Graph& graph, const Config& config);

/// Why `plan` (made with `config`) removes no channel, for the error that refuses it: each skipped
/// group's reason, then how many groups keep every channel at these amounts (round_to and
/// min_channels named as `source` spells them). "the model has no prunable group" when there is
/// nothing else to say.
std::string why_nothing_removed(const Plan& plan, const Config& config, const OptionSource& source);

/// What a removal did.
struct Report {
  std::vector<std::string> pruned;   ///< "group 2 (conv1): 8 → 6 channels"
  int64_t channels_removed = 0;      ///< channels removed in all groups
  std::vector<std::string> skipped;  ///< groups left alone, with the reason
  std::vector<std::string> folded;   ///< "conv2.bias += the constant of 2 removed input position(s)"
  std::vector<std::string> not_folded;  ///< constant outputs dropped where folding is not exact, with why
  NodeCost before, after;
  /// "prune: N channels in M groups; MACs a → b (x %), parameters ..." then the lines.
  std::string summary() const;
};

/// Removes the plan's channels from `graph`: every member tensor sliced (slice_channels), then
/// shapes re-inferred and the graph validated. Each pruned layer records its output channels
/// before its first pruning in the int attribute `unpruned_channels`, and every node with
/// parameters or MACs its cost then in `unpruned_params` and `unpruned_macs` (kept in
/// checkpoints; `whittle inspect` shows them). With `fold_constant_outputs`, a removed channel
/// whose value at a consumer is a constant (a producer's zeroed output through BN, activations,
/// pooling, adds) is added to that consumer's bias (created when absent) where the consumer's
/// response to the constant is the same at every position (no zero padding in between); the
/// report lists where it is not. Throws whittle::Error naming the node when a slice is not
/// representable.
Report remove_channels(Graph& graph, const Plan& plan, bool fold_constant_outputs = true);

/// remove_channels on the module's graph, then module->sync() (the pruned parameters are new
/// tensors: rebuild optimizers over them, runner/optimizer.h).
Report remove_channels(GraphModule& module, const Plan& plan, bool fold_constant_outputs = true);

/// make_plan then remove_channels on the module.
Report prune(GraphModule& module, const Config& config);

/// One-shot pruning's options as the `prune` pass and `whittle prune` name them (the keys of
/// options_schema(); the recipe's prune modifier extends them with its schedule). Defaults are
/// the initializers.
struct PruneOptions {
  std::string criterion = "l1";         ///< l1 | l2 | bn_scale | fpgm | taylor | random
  std::string group_reduction = "sum";  ///< how a group's member scores combine: sum | mean
  double sparsity = 0.5;                ///< fraction of each group's channels removed (no target given), [0, 1)
  std::optional<double> target_macs;    ///< keep this fraction of the unpruned model's MACs, (0, 1]
  std::optional<double> target_params;  ///< keep this fraction of the parameters, (0, 1]
  bool global = false;                  ///< one ranking over all groups
  int64_t round_to = 1;                 ///< kept channels a multiple of this, ≥ 1
  int64_t min_channels = 1;             ///< no group keeps fewer, ≥ 1
  bool fold_constant_outputs = true;    ///< fold removed channels' constants into the next biases
  std::string concat_ranking = "per_layer";  ///< per_layer | whole_group (Config::rank_per_layer)
  std::vector<std::string> targets;     ///< layers whose output channels may go (graph/select.h)
  std::vector<std::string> ignore;      ///< layers left alone
};

/// The keys of PruneOptions: names, descriptions, choices and ranges.
const OptionsSchema<PruneOptions>& options_schema();

/// The options of one call of the `prune` pass (or `whittle prune`): `settings` parsed with
/// options_schema(), then checked together. Throws whittle::Error (usage) naming the key as
/// `source` spells it: a bad value, more than one of sparsity, target_macs and target_params, or
/// criterion taylor (which needs gradients from training: the recipe modifier).
PruneOptions pass_options(const Settings& settings, const OptionSource& source);

/// The Config of `options` (criterion, reduction, amounts, selection). Throws whittle::Error
/// (usage) when both targets are given.
Config make_config(const PruneOptions& options);

/// Registers prune's pass ("prune") with the pass registry (idempotent).
void register_all();

}  // namespace whittle::prune
