#include "graph/graph.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/options.h"
#include "core/shape_limits.h"
#include "graph/op_registry.h"

namespace whittle {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// ---------------------------------------------------------------- NamedTensors

const at::Tensor* NamedTensors::find(const std::string& name) const {
  for (const auto& kv : items_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

at::Tensor* NamedTensors::find(const std::string& name) {
  for (auto& kv : items_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

const at::Tensor& NamedTensors::at(const std::string& name) const {
  const at::Tensor* t = find(name);
  if (!t) throw Error("no tensor named '" + name + "'");
  return *t;
}

void NamedTensors::set(const std::string& name, at::Tensor tensor) {
  if (at::Tensor* t = find(name)) {
    *t = std::move(tensor);
  } else {
    items_.emplace_back(name, std::move(tensor));
  }
}

void NamedTensors::erase(const std::string& name) {
  items_.erase(std::remove_if(items_.begin(), items_.end(), [&](const auto& kv) { return kv.first == name; }),
               items_.end());
}

// ---------------------------------------------------------------- Node attributes

const char* attr_type_name(AttrType type) {
  switch (type) {
    case AttrType::kInt: return "int";
    case AttrType::kBool: return "bool";
    case AttrType::kFloat: return "float";
    case AttrType::kString: return "string";
    case AttrType::kInts: return "ints";
    case AttrType::kFloats: return "floats";
    case AttrType::kPair: return "pair";
  }
  return "?";
}

std::string attr_str(const Attr& value) {
  std::ostringstream os;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          os << '\'' << v << '\'';
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          os << "[";
          for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
          os << "]";
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          os << "[";
          for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << number_text(v[i]);
          os << "]";
        } else if constexpr (std::is_same_v<T, double>) {
          os << number_text(v);
        } else {
          os << v;
        }
      },
      value);
  return os.str();
}

namespace {

AttrSpec with_default(std::string name, AttrType type, Attr fallback, std::string description) {
  AttrSpec s;
  s.name = std::move(name);
  s.type = type;
  s.default_value = std::move(fallback);
  s.description = std::move(description);
  return s;
}

}  // namespace

AttrSpec AttrSpec::integer(std::string name, int64_t fallback, std::string description) {
  return with_default(std::move(name), AttrType::kInt, Attr(fallback), std::move(description));
}

AttrSpec AttrSpec::boolean(std::string name, bool fallback, std::string description) {
  return with_default(std::move(name), AttrType::kBool, Attr(int64_t{fallback ? 1 : 0}), std::move(description));
}

AttrSpec AttrSpec::number(std::string name, double fallback, std::string description) {
  return with_default(std::move(name), AttrType::kFloat, Attr(fallback), std::move(description));
}

AttrSpec AttrSpec::text(std::string name, std::string fallback, std::string description) {
  return with_default(std::move(name), AttrType::kString, Attr(std::move(fallback)), std::move(description));
}

AttrSpec AttrSpec::pair(std::string name, int64_t fallback, std::string description) {
  return with_default(std::move(name), AttrType::kPair, Attr(std::vector<int64_t>{fallback, fallback}),
                      std::move(description));
}

AttrSpec AttrSpec::needed(std::string name, AttrType type, std::string description) {
  AttrSpec s = optional(std::move(name), type, std::move(description));
  s.required = true;
  return s;
}

AttrSpec AttrSpec::optional(std::string name, AttrType type, std::string description) {
  AttrSpec s;
  s.name = std::move(name);
  s.type = type;
  s.description = std::move(description);
  return s;
}

AttrSpec& AttrSpec::range(std::optional<double> lo, std::optional<double> hi) {
  min = lo;
  max = hi;
  return *this;
}

AttrSpec& AttrSpec::one_of(std::vector<std::string> values) {
  choices = std::move(values);
  return *this;
}

AttrSpec& AttrSpec::length(int64_t lo, int64_t hi) {
  min_length = lo;
  max_length = hi;
  return *this;
}

AttrSpec& AttrSpec::checked(std::function<std::string(const Node& node, const Attr& value)> fn) {
  check = std::move(fn);
  return *this;
}

std::string AttrSpec::problem(const Attr& value) const {
  const char* want = "";
  switch (type) {
    case AttrType::kInt: want = "an integer"; break;
    case AttrType::kBool: want = "0 or 1"; break;
    case AttrType::kFloat: want = "a number"; break;
    case AttrType::kString: want = "a string"; break;
    case AttrType::kInts: want = "an integer list"; break;
    case AttrType::kFloats: want = "a number list"; break;
    case AttrType::kPair: want = "an integer or a list of 1 or 2 integers"; break;
  }
  const std::string wrong = "is " + attr_str(value) + ", not " + want;
  auto in_range = [&](double v) -> std::string {
    if (min && v < *min) return "is " + attr_str(value) + ", below the minimum " + number_text(*min);
    if (max && v > *max) return "is " + attr_str(value) + ", above the maximum " + number_text(*max);
    return "";
  };
  auto list_range = [&](const auto& list) -> std::string {
    const auto n = static_cast<int64_t>(list.size());
    if (n < min_length || (max_length >= 0 && n > max_length))
      return "is " + attr_str(value) + ": " + std::to_string(n) + " elements, expected " +
             (min_length == max_length ? std::to_string(min_length)
                                       : std::to_string(min_length) + " to " +
                                             (max_length < 0 ? std::string("any number") : std::to_string(max_length)));
    for (const auto& v : list)
      if (std::string p = in_range(static_cast<double>(v)); !p.empty()) return p;
    return "";
  };
  const auto* i = std::get_if<int64_t>(&value);
  const auto* d = std::get_if<double>(&value);
  const auto* str = std::get_if<std::string>(&value);
  const auto* ints = std::get_if<std::vector<int64_t>>(&value);
  const auto* floats = std::get_if<std::vector<double>>(&value);
  switch (type) {
    case AttrType::kInt:
      return i ? in_range(static_cast<double>(*i)) : wrong;
    case AttrType::kBool:
      return i && (*i == 0 || *i == 1) ? "" : "is " + attr_str(value) + ", not 0 or 1";
    case AttrType::kFloat:
      if (!i && !d) return wrong;
      if (d && !std::isfinite(*d)) return "is " + attr_str(value) + ", not a finite number";
      return in_range(i ? static_cast<double>(*i) : *d);
    case AttrType::kString:
      if (!str) return wrong;
      if (!choices.empty() && std::find(choices.begin(), choices.end(), *str) == choices.end()) {
        std::string known;
        for (const auto& c : choices) known += (known.empty() ? "" : ", ") + c;
        return "is " + attr_str(value) + ", not one of " + known;
      }
      return "";
    case AttrType::kInts:
      return ints ? list_range(*ints) : wrong;
    case AttrType::kFloats:
      if (ints) return list_range(*ints);
      if (!floats) return wrong;
      for (double v : *floats)
        if (!std::isfinite(v)) return "is " + attr_str(value) + ", not all finite";
      return list_range(*floats);
    case AttrType::kPair:
      if (i) return in_range(static_cast<double>(*i));
      if (!ints || ints->empty() || ints->size() > 2) return wrong;
      return list_range(*ints);
  }
  return wrong;
}

std::string AttrSpec::summary() const {
  std::string s = attr_type_name(type);
  if (default_value) s += ", default " + attr_str(*default_value);
  else s += required ? ", required" : ", optional";
  if (min && max) s += ", " + number_text(*min) + " to " + number_text(*max);
  else if (min) s += ", at least " + number_text(*min);
  else if (max) s += ", at most " + number_text(*max);
  if (!choices.empty()) {
    s += ", one of ";
    for (size_t k = 0; k < choices.size(); ++k) s += (k ? "|" : "") + choices[k];
  }
  return s;
}

namespace {

// The attribute's value, or its declared default when absent.
const Attr& find_attr(const Node& n, const std::string& key) {
  auto it = n.attrs.find(key);
  if (it != n.attrs.end()) return it->second;
  const AttrSpec* spec = attr_spec(n, key);
  if (!spec) throw Error("node '" + n.name + "' (" + n.op + "): no attribute '" + key + "' is declared for it");
  if (!spec->default_value) throw Error("node '" + n.name + "' (" + n.op + "): missing attribute '" + key + "'");
  return *spec->default_value;
}

[[noreturn]] void wrong_type(const Node& n, const std::string& key, const char* want) {
  throw Error("node '" + n.name + "' (" + n.op + "): attribute '" + key + "' is not " + want);
}

}  // namespace

int64_t Node::attr_int(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<int64_t>(&a)) return *v;
  wrong_type(*this, key, "an integer");
}

double Node::attr_float(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<double>(&a)) return *v;
  if (auto v = std::get_if<int64_t>(&a)) return static_cast<double>(*v);
  wrong_type(*this, key, "a number");
}

const std::string& Node::attr_str(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<std::string>(&a)) return *v;
  wrong_type(*this, key, "a string");
}

const std::vector<int64_t>& Node::attr_ints(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<std::vector<int64_t>>(&a)) return *v;
  wrong_type(*this, key, "an integer list");
}

std::vector<int64_t> Node::attr_pair(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<int64_t>(&a)) return {*v, *v};
  const auto* l = std::get_if<std::vector<int64_t>>(&a);
  if (!l) wrong_type(*this, key, "an integer or integer list");
  if (l->size() == 1) return {(*l)[0], (*l)[0]};
  if (l->size() != 2) throw Error("node '" + name + "' (" + op + "): attribute '" + key + "' must have 1 or 2 elements");
  return *l;
}

std::vector<double> Node::attr_floats(const std::string& key) const {
  const Attr& a = find_attr(*this, key);
  if (auto v = std::get_if<std::vector<double>>(&a)) return *v;
  if (auto v = std::get_if<std::vector<int64_t>>(&a)) return std::vector<double>(v->begin(), v->end());
  wrong_type(*this, key, "a number list");
}

// ---------------------------------------------------------------- Graph

void Graph::reindex() {
  index_.clear();
  for (size_t i = 0; i < nodes_.size(); ++i) index_[nodes_[i].name] = i;
}

const ValueInfo& Graph::add_input(const std::string& name, Shape shape) {
  if (values_.count(name) || index_.count(name)) throw Error("graph input '" + name + "': name already used");
  if (!elements_within_limit(shape))
    throw Error("graph input '" + name + "': shape " + shape_str(shape) + " has " + shape_limit_problem(shape));
  ValueInfo v;
  v.name = name;
  v.shape = std::move(shape);
  inputs_.push_back(name);
  return values_[name] = std::move(v);
}

std::vector<Shape> Graph::run_shape_inference(const Node& node_in) const {
  // A node running with a transform-computed weight (packed codes) infers shapes from its recorded weight shape.
  const std::optional<Node> stand_in = with_placeholder_weight(node_in);
  const Node& node = stand_in ? *stand_in : node_in;
  const OpTraits& traits = op_traits(node.op);
  check_attributes(node_in);
  const int n_in = static_cast<int>(node.inputs.size());
  if (n_in < traits.min_inputs || (traits.max_inputs >= 0 && n_in > traits.max_inputs)) {
    throw Error("node '" + node.name + "' (" + node.op + "): takes " + std::to_string(traits.min_inputs) +
                (traits.max_inputs == traits.min_inputs ? "" : (traits.max_inputs < 0 ? "+" : "-" + std::to_string(traits.max_inputs))) +
                " inputs, got " + std::to_string(n_in));
  }
  for (const auto& p : traits.required_params) {
    if (!node.params.contains(p))
      throw Error("node '" + node.name + "' (" + node.op + "): missing parameter '" + p + "'");
  }
  for (const auto& b : traits.required_buffers) {
    if (!node.buffers.contains(b))
      throw Error("node '" + node.name + "' (" + node.op + "): missing buffer '" + b + "'");
  }
  std::vector<Shape> in;
  in.reserve(node.inputs.size());
  for (const auto& v : node.inputs) {
    auto it = values_.find(v);
    if (it == values_.end())
      throw Error("node '" + node.name + "' (" + node.op + "): input value '" + v + "' is not defined before it");
    in.push_back(it->second.shape);
  }
  std::vector<Shape> out;
  try {
    out = traits.infer_shapes(node, in);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("node '" + node.name + "' (" + node.op + "): shape inference failed: " + e.what());
  }
  // Inputs within the limit can still give outputs beyond it (upsample, a huge transposed stride).
  for (const Shape& s : out)
    if (!elements_within_limit(s))
      throw Error("node '" + node.name + "' (" + node.op + "): output shape " + shape_str(s) + " has " +
                  shape_limit_problem(s));
  return out;
}

std::vector<std::string> Graph::add_value_records(const Node& node, int num_outputs,
                                                  const std::vector<Shape>& shapes) {
  std::vector<std::string> names;
  for (int i = 0; i < num_outputs; ++i) {
    std::string vn = num_outputs == 1 ? node.name : node.name + ":" + std::to_string(i);
    if (values_.count(vn)) throw Error("node '" + node.name + "': value name '" + vn + "' already used");
    ValueInfo v;
    v.name = vn;
    v.producer = node.name;
    v.output_index = i;
    v.shape = i < static_cast<int>(shapes.size()) ? shapes[i] : Shape{};
    values_[vn] = std::move(v);
    names.push_back(vn);
  }
  return names;
}

std::string Graph::add_node(Node node, int num_outputs) {
  return insert_node_before("", std::move(node), num_outputs);
}

std::string Graph::insert_node_before(const std::string& before, Node node, int num_outputs) {
  if (node.name.empty()) throw Error("node of op '" + node.op + "' has an empty name");
  if (index_.count(node.name) || values_.count(node.name))
    throw Error("node '" + node.name + "': name already used in the graph");
  size_t pos = nodes_.size();
  if (!before.empty()) pos = node_index(before);
  // Inputs must be defined before the insertion point.
  for (const auto& v : node.inputs) {
    auto it = values_.find(v);
    if (it == values_.end())
      throw Error("node '" + node.name + "' (" + node.op + "): input value '" + v + "' is not defined");
    if (!it->second.producer.empty() && node_index(it->second.producer) >= pos)
      throw Error("node '" + node.name + "': input '" + v + "' is produced after the insertion point");
  }
  std::vector<Shape> shapes = run_shape_inference(node);
  if (num_outputs < 1) num_outputs = static_cast<int>(shapes.size());
  if (static_cast<int>(shapes.size()) != num_outputs)
    throw Error("node '" + node.name + "' (" + node.op + "): produces " + std::to_string(shapes.size()) +
                " outputs, " + std::to_string(num_outputs) + " requested");
  node.outputs = add_value_records(node, num_outputs, shapes);
  std::string first = node.outputs.front();
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(pos), std::move(node));
  reindex();
  return first;
}

void Graph::set_outputs(std::vector<std::string> outputs) {
  for (const auto& v : outputs)
    if (!values_.count(v)) throw Error("graph output '" + v + "' is not a value of the graph");
  outputs_ = std::move(outputs);
}

void Graph::replace_all_uses(const std::string& from, const std::string& to, const std::string& after_node) {
  if (!values_.count(to)) throw Error("replace_all_uses: value '" + to + "' does not exist");
  size_t start = after_node.empty() ? 0 : node_index(after_node) + 1;
  for (size_t i = start; i < nodes_.size(); ++i)
    for (auto& in : nodes_[i].inputs)
      if (in == from) in = to;
  for (auto& o : outputs_)
    if (o == from) o = to;
}

void Graph::remove_node(const std::string& name) {
  size_t idx = node_index(name);
  const Node& n = nodes_[idx];
  for (const auto& o : n.outputs) {
    auto u = users(o);
    if (!u.empty()) throw Error("cannot remove node '" + name + "': its output '" + o + "' is used by '" + u.front() + "'");
    if (is_output(o)) throw Error("cannot remove node '" + name + "': '" + o + "' is a graph output");
  }
  for (const auto& o : n.outputs) values_.erase(o);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(idx));
  reindex();
}

void Graph::infer_shapes() {
  for (auto& n : nodes_) {
    std::vector<Shape> shapes = run_shape_inference(n);
    if (shapes.size() != n.outputs.size())
      throw Error("node '" + n.name + "' (" + n.op + "): produces " + std::to_string(shapes.size()) +
                  " outputs but has " + std::to_string(n.outputs.size()));
    for (size_t i = 0; i < shapes.size(); ++i) values_[n.outputs[i]].shape = shapes[i];
  }
}

void Graph::validate() const {
  std::set<std::string> defined(inputs_.begin(), inputs_.end());
  std::set<std::string> names;
  for (const auto& n : nodes_) {
    if (!names.insert(n.name).second) throw Error("node '" + n.name + "': duplicate node name");
    if (!has_op(n.op)) throw Error("node '" + n.name + "': unknown op '" + n.op + "'");
    for (const auto& v : n.inputs) {
      if (!defined.count(v)) {
        if (values_.count(v))
          throw Error("node '" + n.name + "': input '" + v + "' is used before it is produced (cycle or wrong order)");
        throw Error("node '" + n.name + "': input '" + v + "' is a dangling value (no producer)");
      }
    }
    std::vector<Shape> shapes = run_shape_inference(n);
    if (shapes.size() != n.outputs.size())
      throw Error("node '" + n.name + "' (" + n.op + "): produces " + std::to_string(shapes.size()) +
                  " outputs but lists " + std::to_string(n.outputs.size()));
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      auto it = values_.find(n.outputs[i]);
      if (it == values_.end()) throw Error("node '" + n.name + "': output '" + n.outputs[i] + "' has no value record");
      if (it->second.shape != shapes[i])
        throw Error("node '" + n.name + "': output '" + n.outputs[i] + "' is recorded as " + shape_str(it->second.shape) +
                    " but its inputs and parameters give " + shape_str(shapes[i]));
      if (!defined.insert(n.outputs[i]).second) throw Error("node '" + n.name + "': output '" + n.outputs[i] + "' defined twice");
    }
  }
  for (const auto& o : outputs_)
    if (!defined.count(o)) throw Error("graph output '" + o + "' is not produced by any node");
}

Graph Graph::clone(bool clone_tensors) const {
  Graph g = *this;
  if (clone_tensors) {
    for (auto& n : g.nodes_) {
      for (auto& kv : n.params) kv.second = kv.second.detach().clone().set_requires_grad(kv.second.requires_grad());
      for (auto& kv : n.buffers) kv.second = kv.second.detach().clone();
    }
  }
  return g;
}

const Node& Graph::node(const std::string& name) const { return nodes_[node_index(name)]; }
Node& Graph::node(const std::string& name) { return nodes_[node_index(name)]; }

const Node* Graph::find_node(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &nodes_[it->second];
}

Node* Graph::find_node(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &nodes_[it->second];
}

size_t Graph::node_index(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error("no node named '" + name + "' in the graph");
  return it->second;
}

const ValueInfo& Graph::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error("no value named '" + name + "' in the graph");
  return it->second;
}

std::vector<std::string> Graph::users(const std::string& value) const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    if (std::find(n.inputs.begin(), n.inputs.end(), value) != n.inputs.end()) out.push_back(n.name);
  return out;
}

bool Graph::is_output(const std::string& value) const {
  return std::find(outputs_.begin(), outputs_.end(), value) != outputs_.end();
}

std::string Graph::unique_name(const std::string& base) const {
  if (!index_.count(base) && !values_.count(base)) return base;
  for (int i = 1;; ++i) {
    std::string c = base + "_" + std::to_string(i);
    if (!index_.count(c) && !values_.count(c)) return c;
  }
}

namespace {

void print_attr(std::ostream& os, const Attr& a) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          os << '"' << v << '"';
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
          os << "[";
          for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
          os << "]";
        } else {
          os << v;
        }
      },
      a);
}

void print_tensors(std::ostream& os, const char* label, const NamedTensors& ts) {
  if (ts.empty()) return;
  os << " " << label << "{";
  bool first = true;
  for (const auto& kv : ts) {
    os << (first ? "" : ", ") << kv.first << shape_str(kv.second.defined() ? kv.second.sizes().vec() : Shape{});
    first = false;
  }
  os << "}";
}

}  // namespace

std::string Graph::to_string() const {
  std::ostringstream os;
  os << "graph(";
  for (size_t i = 0; i < inputs_.size(); ++i)
    os << (i ? ", " : "") << "%" << inputs_[i] << ": " << shape_str(value(inputs_[i]).shape);
  os << "):\n";
  for (const auto& n : nodes_) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << "%" << n.outputs[i];
    os << " = " << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << "%" << n.inputs[i];
    os << ")";
    if (!n.attrs.empty()) {
      os << " {";
      bool first = true;
      for (const auto& kv : n.attrs) {
        os << (first ? "" : ", ") << kv.first << "=";
        print_attr(os, kv.second);
        first = false;
      }
      os << "}";
    }
    if (!n.weight_transforms.empty()) {
      os << " transforms[";
      for (size_t i = 0; i < n.weight_transforms.size(); ++i) os << (i ? ", " : "") << n.weight_transforms[i];
      os << "]";
    }
    print_tensors(os, "params", n.params);
    print_tensors(os, "buffers", n.buffers);
    os << " -> ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << shape_str(value(n.outputs[i]).shape);
    os << "\n";
  }
  os << "  return (";
  for (size_t i = 0; i < outputs_.size(); ++i) os << (i ? ", " : "") << "%" << outputs_[i];
  os << ")\n";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Graph& graph) { return os << graph.to_string(); }

}  // namespace whittle
