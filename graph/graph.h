#pragma once
// The model-graph IR: Graph, Node, Value (in the style of torch.fx).
//
// A Graph is a topologically ordered list of Nodes joined by named Values (tensors). Each node has
// an op kind (a key of the op registry, see op_registry.h), attributes (stride, padding, ...),
// named parameters and buffers, and a stable dotted name ("layer1.0.conv1") that is also the
// prefix of its tensors in a state_dict ("layer1.0.conv1.weight"). A single-output node's value
// has the node's name; a node with n > 1 outputs produces "name:0" ... "name:n-1".
// Value shapes are static and include the batch dimension of the graph's declared input shapes;
// at run time the batch dimension may differ.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace whittle {

/// A tensor shape, outermost dimension first (NCHW for images).
using Shape = std::vector<int64_t>;

/// "[1, 3, 32, 32]".
std::string shape_str(const Shape& shape);

/// An attribute value: integer (also used for booleans), float, string, or integer/float lists.
using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

struct Node;

/// The type an attribute declares (AttrSpec) and the Attr alternatives it accepts.
enum class AttrType {
  kInt,     ///< int64_t
  kBool,    ///< int64_t 0 or 1
  kFloat,   ///< double (an int64_t is accepted and read as a double)
  kString,  ///< std::string
  kInts,    ///< std::vector<int64_t>
  kFloats,  ///< std::vector<double> (an integer list is accepted)
  kPair,    ///< a 2-D op's per-axis pair (stride, padding): an int64_t or a list of 1 or 2
};

/// Name of an AttrType ("int", "bool", "float", "string", "ints", "floats", "pair").
const char* attr_type_name(AttrType type);

/// "3", "0.5", "'nearest'", "[1, 2]": an attribute value as messages show it.
std::string attr_str(const Attr& value);

/// The declaration of one node attribute: its type, default and valid values. Each op's registry
/// entry declares the attributes its nodes may carry (OpTraits::attributes), as does each weight
/// transform for the attributes it owns; readers take the default from here (Node::attr_int and
/// the other accessors), and Graph::validate() checks every attribute of every node against it.
struct AttrSpec {
  std::string name;
  AttrType type = AttrType::kInt;
  std::string description;  ///< one line, for `whittle inspect --ops`
  /// The value an absent attribute reads as; none: see `required`.
  std::optional<Attr> default_value;
  /// Without a default: true when every node must carry it, false when it may be absent (a reader
  /// checks Node::has_attr, as max pooling's `stride`, which is its kernel size when absent).
  bool required = false;
  /// Numbers, and each element of a list or pair: the valid closed range.
  std::optional<double> min, max;
  /// Strings: the valid values; empty: any (or what `check` allows).
  std::vector<std::string> choices;
  /// Lists: the valid element counts, inclusive; max_length < 0: any.
  int64_t min_length = 0, max_length = -1;
  /// A further check of a present value against its node (names from a registry, a value tied to
  /// another attribute): "" when valid, otherwise what is wrong.
  std::function<std::string(const Node& node, const Attr& value)> check;

  /// An integer attribute with a default.
  static AttrSpec integer(std::string name, int64_t fallback, std::string description);
  /// A boolean (0/1) attribute with a default.
  static AttrSpec boolean(std::string name, bool fallback, std::string description);
  /// A float attribute with a default.
  static AttrSpec number(std::string name, double fallback, std::string description);
  /// A string attribute with a default.
  static AttrSpec text(std::string name, std::string fallback, std::string description);
  /// A pair attribute with a default (both axes `fallback`).
  static AttrSpec pair(std::string name, int64_t fallback, std::string description);
  /// An attribute of `type` every node must carry.
  static AttrSpec needed(std::string name, AttrType type, std::string description);
  /// An attribute of `type` a node may lack (no default).
  static AttrSpec optional(std::string name, AttrType type, std::string description);
  /// Sets the valid range [lo, hi] (numbers and list elements); returns *this.
  AttrSpec& range(std::optional<double> lo, std::optional<double> hi);
  /// Sets the valid string values; returns *this.
  AttrSpec& one_of(std::vector<std::string> values);
  /// Sets the valid list lengths; returns *this.
  AttrSpec& length(int64_t lo, int64_t hi);
  /// Sets the further check; returns *this.
  AttrSpec& checked(std::function<std::string(const Node& node, const Attr& value)> fn);
  /// "" when `value` has this spec's type and lies in its ranges, choices and lengths (`check`
  /// not included); otherwise what is wrong ("is 64, above the maximum 32").
  std::string problem(const Attr& value) const;
  /// "int, default 1, at least 1": the declaration as `whittle inspect` lists it.
  std::string summary() const;
};

/// Ordered name → tensor map, keeping insertion order (as a PyTorch state_dict does).
class NamedTensors {
 public:
  /// The tensor under `name`, or nullptr.
  const at::Tensor* find(const std::string& name) const;
  at::Tensor* find(const std::string& name);
  /// The tensor under `name`; throws whittle::Error naming `name` when absent.
  const at::Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  /// Inserts or replaces (keeping the original position when replacing).
  void set(const std::string& name, at::Tensor tensor);
  /// Removes `name` if present.
  void erase(const std::string& name);
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  std::vector<std::pair<std::string, at::Tensor>> items_;
};

/// One operation of the graph. Plain data: passes edit fields directly and then call
/// Graph::validate() (or use the Graph editing functions, which keep value records consistent).
struct Node {
  std::string name;                  ///< stable dotted name, unique in the graph
  std::string op;                    ///< op kind, a key of the op registry ("conv2d", "relu", ...)
  std::vector<std::string> inputs;   ///< names of the values consumed, in argument order
  std::vector<std::string> outputs;  ///< names of the values produced
  std::map<std::string, Attr> attrs;
  NamedTensors params;   ///< trainable tensors ("weight", "bias")
  NamedTensors buffers;  ///< non-trainable state ("running_mean", "running_var", ...)
  /// The weight transform stack, in application order: names of registered WeightTransforms
  /// (op_registry.h). GraphModule runs the op with the last one's output as its `weight`; each
  /// transform reads the previous one's output (the first reads the `weight` parameter). A
  /// transform's settings are node attributes it owns (WeightTransform::attributes). Empty: the
  /// op runs with its `weight` parameter.
  std::vector<std::string> weight_transforms;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  /// Typed attribute access. An absent attribute reads as the default its declaration gives (the
  /// op's AttrSpec, or that of a weight transform in the node's stack; attr_spec() in
  /// op_registry.h). Throws whittle::Error naming the node and key when the attribute is absent
  /// without a default, undeclared, or of another type.
  int64_t attr_int(const std::string& key) const;
  /// An int or bool attribute as a bool (nonzero: true).
  bool attr_bool(const std::string& key) const { return attr_int(key) != 0; }
  double attr_float(const std::string& key) const;  ///< accepts an integer attribute too
  const std::string& attr_str(const std::string& key) const;
  const std::vector<int64_t>& attr_ints(const std::string& key) const;
  std::vector<double> attr_floats(const std::string& key) const;  ///< accepts an int list too
  /// A 2-element attribute of a 2-D op (stride, padding, dilation, kernel_size): a single integer
  /// or a 1-element list is repeated. Throws whittle::Error naming the node and key for another
  /// length or type.
  std::vector<int64_t> attr_pair(const std::string& key) const;
};

/// What the graph knows about one value.
struct ValueInfo {
  std::string name;
  std::string producer;  ///< producing node's name; empty for a graph input
  int output_index = 0;  ///< index among the producer's outputs
  Shape shape;           ///< static shape (with the declared batch size)
};

/// A topologically ordered dataflow graph of Nodes.
class Graph {
 public:
  Graph() = default;

  // ---- building ----
  /// Declares a graph input value with its example shape (batch dimension included).
  /// Throws whittle::Error if the name is taken, or the shape has a negative dimension or more than
  /// kMaxShapeElements (2^40) elements.
  const ValueInfo& add_input(const std::string& name, Shape shape);
  /// Appends a node after all existing ones, infers its output shapes through the op registry, and
  /// returns the name of its first output. `num_outputs` > 1 names outputs "name:i".
  /// Throws whittle::Error if the name is taken, an input value is unknown, the op is unknown, or
  /// shape inference rejects the input shapes (the message names the node).
  std::string add_node(Node node, int num_outputs = 1);
  /// Inserts a node immediately before the node `before` (same rules as add_node).
  std::string insert_node_before(const std::string& before, Node node, int num_outputs = 1);
  /// Marks values as graph outputs, in order.
  void set_outputs(std::vector<std::string> outputs);

  // ---- editing ----
  /// Replaces every use of value `from` (node inputs and graph outputs) by value `to`.
  /// When `after_node` is given, only uses by nodes after that node are replaced.
  void replace_all_uses(const std::string& from, const std::string& to,
                        const std::string& after_node = "");
  /// Removes a node. Throws whittle::Error if one of its outputs is still used.
  void remove_node(const std::string& name);
  /// Re-runs shape inference over the whole graph (after a pass changed parameters or attributes).
  void infer_shapes();
  /// Checks structure and shapes: unique names, every input defined before use (so no cycles),
  /// known ops, expected parameters present, and shape inference consistent with the parameters.
  /// Throws whittle::Error naming the first offending node.
  void validate() const;
  /// Deep copy; tensors are cloned too when `clone_tensors` (otherwise shared).
  Graph clone(bool clone_tensors = true) const;

  // ---- queries ----
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<std::string>& inputs() const { return inputs_; }
  const std::vector<std::string>& outputs() const { return outputs_; }
  /// The node named `name`; throws whittle::Error when absent.
  const Node& node(const std::string& name) const;
  Node& node(const std::string& name);
  const Node* find_node(const std::string& name) const;
  Node* find_node(const std::string& name);
  /// Position of the node in topological order; throws when absent.
  size_t node_index(const std::string& name) const;
  /// The value named `name`; throws whittle::Error when absent.
  const ValueInfo& value(const std::string& name) const;
  bool has_value(const std::string& name) const { return values_.count(name) != 0; }
  /// Names of the nodes consuming value `name`, in graph order (a node consuming it twice appears once).
  std::vector<std::string> users(const std::string& value) const;
  /// True when `value` is one of the graph outputs.
  bool is_output(const std::string& value) const;
  /// A node name not used yet, built from `base` ("base", "base_1", ...).
  std::string unique_name(const std::string& base) const;

  /// Deterministic text form, one node per line:
  /// "%layer1.0.conv1 = conv2d(%relu) {stride=[1, 1], ...} params{weight[16, 16, 3, 3]} -> [1, 16, 32, 32]".
  std::string to_string() const;

 private:
  std::vector<std::string> add_value_records(const Node& node, int num_outputs,
                                             const std::vector<Shape>& shapes);
  std::vector<Shape> run_shape_inference(const Node& node) const;
  void reindex();

  std::vector<Node> nodes_;
  std::map<std::string, ValueInfo> values_;
  std::map<std::string, size_t> index_;
  std::vector<std::string> inputs_;
  std::vector<std::string> outputs_;
};

std::ostream& operator<<(std::ostream& os, const Graph& graph);

}  // namespace whittle
