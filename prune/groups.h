#pragma once
// Dependency groups: the channels that channel pruning must remove together, computed from the
// graph alone through each op's registry entry (graph/op_registry.h: is_weighted_layer,
// channel_ties, channel_map, channel_tensors). docs/pruning.md describes the rules.
//
// Every channel position of every value is assigned a channel "unit". A producer (conv2d,
// conv_transpose2d, linear) creates one unit per output channel, unless its outputs are bound to
// its inputs (depthwise convolution, channel multiplier: channel_ties); ops without channels of
// their own pass units through by their ChannelMap, which binds units together where the op
// couples them (a residual add binds both operands' units, a reshape from features to channels
// binds a channel's H·W features). The units bound together are one channel of a group; the
// channels that share a tensor axis (a layer's output, a consumer's input, a BN's statistics)
// form a DependencyGroup. A channel_shuffle binds position k of each of its g input groups into
// one channel (so it stays a shuffle after pruning). Graph inputs and outputs, and channels that
// pass an op pruning cannot follow (softmax over channels, a general reshape), are fixed: never
// removed.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace whittle::prune {

/// One side of one node that a group's channels live on.
struct Member {
  std::string node;                          ///< node name
  std::string op;                            ///< its op kind
  ChannelRole role = ChannelRole::kOutput;   ///< which side: a producer's outputs, a consumer's inputs, a pass-through op's channels
  int64_t size = 0;                          ///< channel positions on that side (dim 1 of the value; features for rank 2)
  /// For each channel of the group, its positions on this side (ascending; several after a
  /// flatten, H·W features per channel; the same tensor concatenated twice gives two; empty when
  /// the channel does not reach this member).
  std::vector<std::vector<int64_t>> positions;
  /// The member's tensors that carry these channels: (name, axis), from channel_tensors().
  std::vector<std::pair<std::string, int64_t>> tensors;
  /// True when the node is a producer whose outputs are bound to its inputs (depthwise): slicing
  /// its output side also slices its input side.
  bool tied = false;
};

/// Channels that are removed together, with every tensor axis they live on.
struct DependencyGroup {
  int64_t id = 0;
  int64_t channels = 0;               ///< channels of the group (pruning units)
  std::vector<Member> members;        ///< in graph order
  std::vector<bool> fixed;            ///< per channel: never removed
  std::string fixed_reason;           ///< why channels are fixed (the first reason met), "" when none is
  /// Grouped convolutions among the members (groups g > 1, not depthwise) require every one of
  /// their groups to keep the same number of channels: channel k belongs to segment[k] of
  /// `segments` (the LCM of the groups of the members that see each channel inside one of their
  /// groups; a member that sees every channel spread evenly over its groups, as after a channel
  /// shuffle, constrains nothing), and pruning keeps the same count in every segment.
  int64_t segments = 1;
  std::vector<int64_t> segment;       ///< per channel (all 0 when segments is 1)
  /// Names of the producer members (the layers whose output channels the group holds).
  std::vector<std::string> producers() const;
  /// Channels that may be removed (not fixed).
  int64_t prunable() const;
  /// Multi-line description: the group, its channel count, each member as "node (op) role
  /// size: tensor[axis]... positions of channel 0, 1, ...", and the fixed channels' reason.
  std::string to_string() const;
};

/// The dependency groups of `graph` (validated), in the order of their first member. Groups
/// holding only fixed channels are included (with their reason). Throws whittle::Error naming the
/// node for a graph whose ops' channel maps disagree with its shapes.
std::vector<DependencyGroup> dependency_groups(const Graph& graph);

}  // namespace whittle::prune
