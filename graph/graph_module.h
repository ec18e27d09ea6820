#pragma once
// GraphModule: a torch::nn::Module that runs a Graph.

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace whittle {

/// Runs a Graph as a LibTorch module. Each node's parameters and buffers are registered under its
/// dotted name through a tree of child modules ("layer1" → "0" → "conv1"), so named_parameters(),
/// state_dict keys ("layer1.0.conv1.weight"), optimizers, train()/eval() and to(device, dtype)
/// behave as for any LibTorch module. The node tensors and the registered tensors are the same
/// objects; to() converts them in place (floating tensors only change dtype; integer buffers
/// such as num_batches_tracked keep theirs).
///
/// A node with a weight transform stack (Node::weight_transforms) runs with the stack's output in
/// place of its `weight` (masks, QAT BN folding, quantizers, packed codes; see op_registry.h).
///
/// Passes mutate graph() and then call sync() to re-register the tensors.
class GraphModuleImpl : public torch::nn::Module {
 public:
  /// Takes the graph; validates it (throws whittle::Error naming the offending node).
  explicit GraphModuleImpl(Graph graph);

  /// Runs the graph on its single input and returns its single output.
  /// Throws whittle::Error if the graph has several inputs or outputs.
  at::Tensor forward(const at::Tensor& input);
  /// Runs the graph on its inputs (in graph input order) and returns its outputs.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs);
  /// Runs the graph and also returns the values named in `capture` (node or value names), as
  /// distillation needs for intermediate features. Throws whittle::Error for an unknown name.
  std::vector<at::Tensor> forward_with_intermediates(const std::vector<at::Tensor>& inputs,
                                                     const std::vector<std::string>& capture,
                                                     std::map<std::string, at::Tensor>* captured);

  /// Activation checkpointing (Chen et al., 2016, arXiv:1604.06174; torch.utils.checkpoint): in a
  /// training-mode forward with gradients on, each segment, the nodes named `prefix` or
  /// `prefix.<anything>` (e.g. "layer2" for a ResNet stage, "layer2.1" for one block), runs keeping
  /// only its inputs for the backward, not its intermediate values (the activations, and what the
  /// quantizers' straight-through estimators hold); the backward runs it once more to get them.
  /// The recomputation sees the forward's random state (dropout draws the same mask) and autocast
  /// setting, and leaves the segment's buffers as the forward left them (batch-norm running
  /// statistics are updated once), so outputs and gradients are those of the plain forward. A
  /// forward that captures intermediates (forward_with_intermediates) runs without it. An empty
  /// list turns it off; sync() resolves the prefixes again. Throws whittle::Error for a prefix that
  /// names no node, or whose nodes are not one run in graph order.
  void set_checkpoint_segments(const std::vector<std::string>& prefixes);
  /// The prefixes of set_checkpoint_segments.
  const std::vector<std::string>& checkpoint_segments() const { return checkpoint_prefixes_; }

  const Graph& graph() const { return graph_; }
  Graph& graph() { return graph_; }
  /// Re-registers every node's tensors after the graph was changed (nodes added, removed, or
  /// tensors replaced), and rebuilds the execution plan. Validates the graph first.
  void sync();

  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

 private:
  struct Step {
    const Node* node;
    const OpTraits* traits;
    std::vector<size_t> inputs;
    std::vector<size_t> outputs;
    std::vector<const WeightTransform*> transforms;  ///< the node's weight transform stack, in order
    std::shared_ptr<Node> shadow;  ///< copy of the node whose weight is the transformed one, for the op's forward
    std::vector<size_t> release;   ///< slots whose last use is this step (dropped after it runs)
  };
  /// Plan steps [begin, end) run as one checkpointed segment; `inputs` the slots they read that are
  /// produced before them, `outputs` the slots they produce that are read after them (or are graph
  /// outputs), `params` the trainable parameters of their nodes.
  struct Segment {
    std::string prefix;
    size_t begin = 0, end = 0;
    std::vector<size_t> inputs, outputs;
  };
  friend struct CheckpointFn;
  void build_plan();
  void build_segments();
  /// Runs one plan step on env (inputs read from, outputs written to their slots).
  void run_step(const Step& step, std::vector<at::Tensor>& env, bool training) const;
  /// Runs segment `s` on its input values; returns its output values.
  std::vector<at::Tensor> run_segment(const Segment& s, const std::vector<at::Tensor>& inputs, bool training) const;
  /// Runs segment `index` through the checkpointing autograd function, from and into env.
  void run_checkpointed(int index, std::vector<at::Tensor>& env) const;
  /// The trainable parameters of segment `s`'s nodes, in node order.
  std::vector<at::Tensor> segment_params(const Segment& s) const;
  void register_tensors();
  void convert(std::optional<torch::Device> device, std::optional<torch::Dtype> dtype, bool non_blocking);

  Graph graph_;
  std::vector<Step> plan_;
  std::vector<size_t> input_slots_;
  std::vector<size_t> output_slots_;
  std::map<std::string, size_t> slot_of_;
  size_t num_slots_ = 0;
  std::vector<std::string> top_children_;
  std::vector<std::string> checkpoint_prefixes_;
  std::vector<Segment> segments_;
  std::vector<int> segment_at_;  ///< per plan step: index into segments_ of the segment starting there, or −1
};

TORCH_MODULE(GraphModule);

/// What a pass over a module's graph needs of the module's mode.
enum class ModuleMode {
  kAny,   ///< the pass works in either mode
  kEval,  ///< the pass reads BN running statistics, which only the eval form uses
};

/// Runs `pass(module->graph())`, then module->sync() (re-registering the tensors the pass
/// changed), and returns what the pass returned: the GraphModule overload of every graph pass.
/// With ModuleMode::kEval it first throws whittle::Error naming `pass_name` when the module is in
/// training mode (folding must never use batch statistics).
template <class Pass>
auto run_on_module(GraphModule& module, const char* pass_name, ModuleMode mode, Pass&& pass) {
  if (mode == ModuleMode::kEval && module->is_training())
    throw Error(std::string(pass_name) + ": the module is in training mode; the pass uses the running statistics "
                "that eval() uses (never batch statistics), so call module->eval() first");
  auto result = pass(module->graph());
  module->sync();
  return result;
}

}  // namespace whittle
