#include "graph/serialize.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_number.h"
#include "core/shape_limits.h"

namespace whittle {

using json = nlohmann::ordered_json;

namespace {

// 2: weight transform stacks ("weight_transforms": [...]) instead of the attributes
// weight_transform / folded_weight_transform, which version 1 files are read with.
constexpr int kGraphFormatVersion = 2;

json attr_to_json(const Attr& a) {
  json j;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) j["type"] = "int";
        else if constexpr (std::is_same_v<T, double>) j["type"] = "float";
        else if constexpr (std::is_same_v<T, std::string>) j["type"] = "string";
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) j["type"] = "ints";
        else j["type"] = "floats";
        j["value"] = v;
      },
      a);
  return j;
}

Attr attr_from_json(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j.contains("value"))
    throw Error(where + ": attribute must be {\"type\": ..., \"value\": ...}");
  const std::string type = j.at("type").get<std::string>();
  const json& v = j.at("value");
  if (type == "int" && v.is_number_integer()) return json_int64(v, where);
  if (type == "float" && v.is_number()) return v.get<double>();
  if (type == "string" && v.is_string()) return v.get<std::string>();
  if (type == "ints" && v.is_array()) {
    for (const auto& e : v)
      if (!e.is_number_integer()) throw Error(where + ": 'ints' attribute holds a non-integer");
    return json_int64s(v, where);
  }
  if (type == "floats" && v.is_array()) {
    for (const auto& e : v)
      if (!e.is_number()) throw Error(where + ": 'floats' attribute holds a non-number");
    return v.get<std::vector<double>>();
  }
  throw Error(where + ": attribute of type '" + type + "' has a value of the wrong kind");
}

json tensors_to_json(const NamedTensors& ts) {
  json arr = json::array();
  for (const auto& kv : ts) {
    if (!kv.second.defined()) continue;
    arr.push_back({{"name", kv.first}, {"shape", kv.second.sizes().vec()}, {"dtype", dtype_name(kv.second.scalar_type())}});
  }
  return arr;
}

const json& need(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error(where + ": missing key '" + key + "'");
  return j.at(key);
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: throw Error(std::string("unsupported tensor dtype ") + c10::toString(dtype));
  }
}

at::ScalarType dtype_from_name(const std::string& name) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort}, {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  for (const auto& [n, t] : table)
    if (name == n) return t;
  throw Error("unknown dtype '" + name + "'");
}

std::string graph_to_json(const Graph& graph) {
  json j;
  j["format"] = "whittle.graph";
  j["version"] = kGraphFormatVersion;
  json inputs = json::array();
  for (const auto& in : graph.inputs()) inputs.push_back({{"name", in}, {"shape", graph.value(in).shape}});
  j["inputs"] = inputs;
  json nodes = json::array();
  for (const auto& n : graph.nodes()) {
    json jn;
    jn["name"] = n.name;
    jn["op"] = n.op;
    jn["inputs"] = n.inputs;
    jn["outputs"] = n.outputs;
    json attrs = json::object();
    for (const auto& kv : n.attrs) attrs[kv.first] = attr_to_json(kv.second);
    jn["attrs"] = attrs;
    if (!n.weight_transforms.empty()) jn["weight_transforms"] = n.weight_transforms;
    jn["params"] = tensors_to_json(n.params);
    jn["buffers"] = tensors_to_json(n.buffers);
    nodes.push_back(jn);
  }
  j["nodes"] = nodes;
  j["outputs"] = graph.outputs();
  return j.dump(1);
}

Graph graph_from_json(const std::string& json_text, const TensorSource& source, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(origin + ": graph structure is not valid JSON (" + e.what() + ")");
  }
  try {
    if (!j.is_object() || j.value("format", "") != "whittle.graph")
      throw Error(origin + ": not a whittle graph structure (format key missing or wrong)");
    const int64_t version = json_int64(need(j, "version", origin), origin + ": version");
    if (version > kGraphFormatVersion)
      throw Error(origin + ": graph structure version " + std::to_string(version) +
                  " is newer than this whittle understands (" + std::to_string(kGraphFormatVersion) +
                  "); upgrade whittle");
    Graph g;
    for (const auto& in : need(j, "inputs", origin))
      g.add_input(need(in, "name", origin + " inputs").get<std::string>(),
                  json_int64s(need(in, "shape", origin + " inputs"), origin + " inputs: shape"));
    for (const auto& jn : need(j, "nodes", origin)) {
      Node n;
      n.name = need(jn, "name", origin + " node").get<std::string>();
      const std::string where = origin + ": node '" + n.name + "'";
      n.op = need(jn, "op", where).get<std::string>();
      n.inputs = need(jn, "inputs", where).get<std::vector<std::string>>();
      auto outputs = need(jn, "outputs", where).get<std::vector<std::string>>();
      if (outputs.empty()) throw Error(where + ": has no outputs");
      for (const auto& kv : need(jn, "attrs", where).items()) n.attrs[kv.key()] = attr_from_json(kv.value(), where + " attribute '" + kv.key() + "'");
      if (jn.contains("weight_transforms")) {
        if (!jn["weight_transforms"].is_array()) throw Error(where + ": weight_transforms is not a list of names");
        for (const auto& t : jn["weight_transforms"]) {
          if (!t.is_string()) throw Error(where + ": weight_transforms is not a list of names");
          n.weight_transforms.push_back(t.get<std::string>());
        }
      }
      // Version 1: one transform in the attribute weight_transform; QAT BN folding kept the
      // quantizer it wraps in folded_weight_transform. The stack is [weight_transform, folded].
      for (const char* key : {"weight_transform", "folded_weight_transform"}) {
        auto it = n.attrs.find(key);
        if (it == n.attrs.end() || version >= 2) continue;
        if (!std::holds_alternative<std::string>(it->second)) throw Error(where + ": attribute " + key + " is not a name");
        n.weight_transforms.push_back(std::get<std::string>(it->second));
        n.attrs.erase(it);
      }

      for (const char* kind : {"params", "buffers"}) {
        const TensorRole role = std::string(kind) == "params" ? TensorRole::kParam : TensorRole::kBuffer;
        for (const auto& jt : need(jn, kind, where)) {
          const std::string tname = need(jt, "name", where).get<std::string>();
          const Shape shape = json_int64s(need(jt, "shape", where + " tensor '" + tname + "'"),
                                               where + " tensor '" + tname + "': shape");
          for (int64_t d : shape)
            if (d < 0) throw Error(where + " tensor '" + tname + "': negative dimension in " + shape_str(shape));
          if (!elements_within_limit(shape))
            throw Error(where + " tensor '" + tname + "': shape " + shape_str(shape) + " has more than 2^40 elements");
          const at::ScalarType dtype = dtype_from_name(need(jt, "dtype", where + " tensor '" + tname + "'").get<std::string>());
          at::Tensor t = source ? source(n.name, role, tname, shape, dtype) : at::zeros(shape, at::TensorOptions().dtype(dtype));
          if (!t.defined() || t.sizes().vec() != shape || t.scalar_type() != dtype)
            throw Error(where + " tensor '" + tname + "': expected " + dtype_name(dtype) + " " + shape_str(shape) + ", got " +
                        (t.defined() ? dtype_name(t.scalar_type()) + " " + shape_str(t.sizes().vec()) : std::string("nothing")));
          if (role == TensorRole::kParam) {
            n.params.set(tname, t.detach().set_requires_grad(at::isFloatingType(dtype)));
          } else {
            n.buffers.set(tname, t.detach());
          }
        }
      }
      std::string first = g.add_node(std::move(n), static_cast<int>(outputs.size()));
      const Node& added = g.nodes().back();
      if (added.outputs != outputs)
        throw Error(where + ": output names do not follow the naming rule (got " + outputs.front() + ", expected " + first + ")");
    }
    g.set_outputs(need(j, "outputs", origin).get<std::vector<std::string>>());
    // A model takes something and gives something; an empty list is a damaged or foreign file.
    if (g.inputs().empty()) throw Error(origin + ": the graph has no inputs");
    if (g.outputs().empty()) throw Error(origin + ": the graph has no outputs");
    g.validate();
    return g;
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": malformed graph structure (" + e.what() + ")");
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(origin, 0) == 0) throw;
    throw Error(origin + ": " + e.what());
  }
}

}  // namespace whittle
