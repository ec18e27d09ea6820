#include "export/torchscript_export.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/deploy.h"
#include "export/writers.h"
#include "graph/op_registry.h"

namespace whittle {

namespace {

// A TorchScript identifier for a whittle name: "v_" + the name with every other character as '_'.
std::string identifier(const std::string& name) {
  std::string s = "v_";
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : name) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// A string literal for getattr: whittle names are dotted identifiers; quotes and backslashes are
// escaped anyway.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// Python keywords: TorchScript's serializer writes attribute names unquoted when they are
// identifiers, so a keyword part ("in", "None") would make a file torch.jit.load cannot read.
bool is_keyword(const std::string& s) {
  static const char* const kKeywords[] = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
                                          "continue", "def", "del", "elif", "else", "except", "finally", "for", "from",
                                          "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass",
                                          "raise", "return", "try", "while", "with", "yield"};
  for (const char* k : kKeywords)
    if (s == k) return true;
  return false;
}

}  // namespace

TorchScriptEmitter::TorchScriptEmitter(const Graph& graph) : graph_(graph) {
  auto bind = [&](const std::string& value) {
    std::string base = identifier(value), name = base;
    for (int k = 1; used_.count(name); ++k) name = base + "_" + std::to_string(k);
    used_[name] = 1;
    vars_[value] = name;
  };
  for (const std::string& v : graph.inputs()) bind(v);
  for (const Node& n : graph.nodes())
    for (const std::string& v : n.outputs) bind(v);
}

const std::string& TorchScriptEmitter::var(const std::string& value) const {
  auto it = vars_.find(value);
  if (it == vars_.end()) throw Error("TorchScript export: unknown value '" + value + "'");
  return it->second;
}

void TorchScriptEmitter::line(const std::string& statement) { lines_.push_back(statement); }

std::string TorchScriptEmitter::temp(const std::string& hint) {
  std::string base = "t_" + identifier(hint).substr(2), name = base;
  for (int k = 1; used_.count(name); ++k) name = base + "_" + std::to_string(k);
  used_[name] = 1;
  return name;
}

std::string TorchScriptEmitter::tensor(const Node& n, const std::string& name, const at::Tensor& t, bool parameter) {
  const std::string dotted = n.name + "." + name;
  for (const std::string& part : split_dots(dotted))
    if (part.empty() || is_keyword(part))
      throw Error("node '" + n.name + "' (" + n.op + "): TorchScript export cannot name a submodule or tensor '" + part +
                  "' (" + (part.empty() ? "an empty name part" : "a Python keyword") + "); rename the node");
  for (const auto& entry : tensors_)
    if (entry.first == dotted) throw Error("node '" + n.name + "' (" + n.op + "): tensor '" + name + "' written twice");
  at::Tensor copy = t.detach().to(at::kCPU).clone().contiguous();
  tensors_.push_back({dotted, {copy, parameter}});
  std::string access = "self";
  for (const std::string& part : split_dots(dotted)) access = "getattr(" + access + ", " + quoted(part) + ")";
  const std::string v = temp(dotted);
  line(v + " = " + access);
  return v;
}

std::string TorchScriptEmitter::tensor(const Node& n, const std::string& name) {
  if (const at::Tensor* p = n.params.find(name); p && p->defined()) return tensor(n, name, *p, true);
  if (const at::Tensor* b = n.buffers.find(name); b && b->defined()) return tensor(n, name, *b, false);
  return "None";
}

std::string TorchScriptEmitter::weight(const Node& n) {
  at::NoGradGuard no_grad;
  return tensor(n, "weight", transformed_weight(n, /*training=*/false), true);
}

const Shape& TorchScriptEmitter::shape(const std::string& value) const { return graph_.value(value).shape; }

std::string TorchScriptEmitter::ints(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}

std::string TorchScriptEmitter::number(double v) {
  if (std::isnan(v)) return "float(\"nan\")";
  if (std::isinf(v)) return v > 0 ? "float(\"inf\")" : "float(\"-inf\")";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string TorchScriptEmitter::boolean(bool v) { return v ? "True" : "False"; }

void TorchScriptEmitter::unsupported(const Node& n, const std::string& what) const {
  throw Error("node '" + n.name + "' (" + n.op + "): no TorchScript form for " + what);
}

namespace {

struct Generated {
  std::string source;
  std::vector<std::pair<std::string, std::pair<at::Tensor, bool>>> tensors;
};

Generated generate(const Graph& graph) {
  register_export_writers();
  require_forms(graph, "TorchScript", torchscript_forms());
  TorchScriptEmitter e(graph);
  for (const Node& n : graph.nodes()) torchscript_forms().get(n.op)(n, e);
  std::ostringstream src;
  src << "def forward(self";
  for (const std::string& v : graph.inputs()) src << ", " << e.var(v) << ": Tensor";
  const auto& outs = graph.outputs();
  src << ")";
  if (outs.size() == 1) {
    src << " -> Tensor";
  } else {
    src << " -> Tuple[";
    for (size_t i = 0; i < outs.size(); ++i) src << (i ? ", " : "") << "Tensor";
    src << "]";
  }
  src << ":\n";
  for (const std::string& l : e.lines()) src << "    " << l << "\n";
  src << "    return ";
  for (size_t i = 0; i < outs.size(); ++i) src << (i ? ", " : "") << e.var(outs[i]);
  src << "\n";
  return {src.str(), e.tensors()};
}

}  // namespace

std::string torchscript_source(const Graph& graph) { return generate(deploy_graph(graph)).source; }

torch::jit::Module to_torchscript_module(const Graph& graph_in, const TorchScriptOptions&) {
  const Graph graph = deploy_graph(graph_in);
  Generated gen = generate(graph);
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  int classes = 0;
  auto make = [&](const std::string& what) {
    return torch::jit::Module(c10::QualifiedName("__torch__.whittle." + what + "_" + std::to_string(classes++)), cu, true);
  };
  torch::jit::Module top = make("Model");
  std::map<std::string, torch::jit::Module> modules;  // dotted path → submodule
  for (const auto& [dotted, entry] : gen.tensors) {
    std::vector<std::string> parts = split_dots(dotted);
    torch::jit::Module owner = top;
    std::string path;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      path += (i ? "." : "") + parts[i];
      auto it = modules.find(path);
      if (it == modules.end()) {
        if (owner.hasattr(parts[i]))
          throw Error("TorchScript export: '" + path + "' is both a tensor and a node name prefix");
        torch::jit::Module child = make("Node");
        owner.register_module(parts[i], child);
        it = modules.emplace(path, child).first;
      }
      owner = it->second;
    }
    if (owner.hasattr(parts.back()))
      throw Error("TorchScript export: '" + dotted + "' is both a tensor and a node name prefix");
    if (entry.second) owner.register_parameter(parts.back(), entry.first, /*is_buffer=*/false);
    else owner.register_buffer(parts.back(), entry.first);
  }
  try {
    top.define(gen.source);
  } catch (const std::exception& ex) {
    throw Error("TorchScript export: TorchScript rejects the generated forward (" + message_of(ex) + ")\n" + gen.source);
  }
  top.eval();
  return top;
}

void export_torchscript(const Graph& graph, const std::string& path, const TorchScriptOptions& options) {
  torch::jit::Module m = to_torchscript_module(graph, options);
  write_atomic(path, [&](const std::string& tmp) {
    try {
      // Through a FileSink: LibTorch's own file writer aborts the process on a full disk.
      FileSink sink(tmp);
      m.save(sink.stream());
      sink.close();
    } catch (const std::exception& ex) {
      std::string msg = message_of(ex);
      if (msg.rfind(tmp + ": ", 0) == 0) msg = msg.substr(tmp.size() + 2);
      throw Error(path + ": cannot write the TorchScript file (" + msg + ")");
    }
    // What was written must load back (torch.jit.load reads the same archive) before it replaces `path`.
    try {
      torch::jit::load(tmp, at::kCPU);
    } catch (const std::exception& ex) {
      throw Error(path + ": the written TorchScript file does not load back (" + message_of(ex) + ")");
    }
  });
}

}  // namespace whittle
