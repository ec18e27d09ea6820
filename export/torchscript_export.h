#pragma once
// TorchScript export: a whittle graph as a torch::jit::Module that `torch.jit.load` opens in a
// plain Python process (no whittle library, no custom ops). Each node's tensors are registered
// under its dotted name as nested submodules ("layer1.0.conv1.weight" in the state_dict), and
// a generated `forward` calls ATen operators only (torch.conv2d, torch.batch_norm, ...), the
// same ones with the same arguments whittle's eval forward calls, so outputs are bitwise equal.
// The graph is written in deploy form (deploy.h): quantized layers hold their decoded eval
// weights, activation quantizers become plain tensor ops (clamp, round, where).
//
// The writer walks the graph and calls each node's OpTraits::to_torchscript hook
// (op_registry.h) with a TorchScriptEmitter; an op without a hook is a whittle::Error naming the
// node, and nothing is written.

#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace torch::jit {
struct Module;
}

namespace whittle {

/// Options of export_torchscript (none yet: the module is always the deploy form in eval mode;
/// the argument keeps the signature stable as options are added).
struct TorchScriptOptions {};

/// The TorchScript module of `graph` (deploy form, eval mode, on the CPU). Throws whittle::Error
/// naming the node for an op without a TorchScript form, or when TorchScript rejects the
/// generated source (the message quotes it).
torch::jit::Module to_torchscript_module(const Graph& graph, const TorchScriptOptions& options = {});

/// Writes to_torchscript_module(graph) with torch::jit::Module::save to `path` atomically (a
/// temporary file renamed over `path` when complete). Throws whittle::Error as
/// to_torchscript_module, or naming the path when it cannot be written.
void export_torchscript(const Graph& graph, const std::string& path, const TorchScriptOptions& options = {});

/// The generated TorchScript source of `graph`'s forward (what to_torchscript_module compiles).
std::string torchscript_source(const Graph& graph);

/// What a to_torchscript hook writes through (op_registry.h TorchScriptWriteFn): the statements
/// of `forward` and the tensors of the module.
class TorchScriptEmitter {
 public:
  explicit TorchScriptEmitter(const Graph& graph);

  /// The local variable holding a value (a TorchScript identifier derived from its name).
  const std::string& var(const std::string& value) const;
  /// Appends one statement to forward ("y = torch.relu(x)").
  void line(const std::string& statement);
  /// Registers `t` under the node's submodule as `name` (a parameter when `parameter`, else a
  /// buffer) and returns a local variable bound to it.
  std::string tensor(const Node& n, const std::string& name, const at::Tensor& t, bool parameter);
  /// The node's own parameter or buffer `name` registered as such; "None" when it lacks it.
  std::string tensor(const Node& n, const std::string& name);
  /// The weight the node runs with in eval (its transform stack applied, packed codes decoded),
  /// registered as the parameter `weight`.
  std::string weight(const Node& n);
  /// The static shape of a value (batch dimension as declared).
  const Shape& shape(const std::string& value) const;
  /// A fresh local variable name.
  std::string temp(const std::string& hint);
  /// TorchScript literals: an int list "[1, 2]", a float that reads back as the same double
  /// ("0.10000000000000001", "1.0"), a bool.
  static std::string ints(const std::vector<int64_t>& values);
  static std::string number(double value);
  static std::string boolean(bool value);
  /// Throws whittle::Error "node 'n' (op): no TorchScript form for <what>".
  [[noreturn]] void unsupported(const Node& n, const std::string& what) const;

  /// The tensors registered so far: dotted name → (tensor, is parameter), in order.
  const std::vector<std::pair<std::string, std::pair<at::Tensor, bool>>>& tensors() const { return tensors_; }
  /// The statements of forward so far.
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  const Graph& graph_;
  std::map<std::string, std::string> vars_;
  std::map<std::string, int> used_;
  std::vector<std::string> lines_;
  std::vector<std::pair<std::string, std::pair<at::Tensor, bool>>> tensors_;
};

}  // namespace whittle
