// TorchScript → whittle Graph (see torchscript_import.h).
//
// The importer interprets the module's forward graph abstractly: every TorchScript value maps to an
// AVal that is either a constant (ints, floats, lists, module objects, parameter tensors, folded at
// the example input shape), a whittle tensor (a value of the graph being built), or a list/tuple of
// AVals. prim::CallMethod / prim::CallFunction are followed into the callee's graph (the same
// result as torch::jit::Inline, with the module path known from the prim::GetAttr chain), prim::If
// and prim::Loop run the branch / the iterations their constant conditions select, ops without a
// whittle tensor argument are constant-folded by running the JIT operator, and the remaining aten
// ops are mapped onto registry ops. Nodes are first built under temporary names (shape inference
// runs as they are added); final names are chosen once the call structure is known.

#include "graph/torchscript_import.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/script.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle {
namespace {

namespace jit = torch::jit;

// How a constant integer relates to the batch size of the graph input.
enum class Batch {
  kNo,       // independent of the batch size
  kExact,    // equals the batch size (x.size(0), through NumToTensor / Int)
  kDerived,  // computed from the batch size otherwise
};

Batch worst(Batch a, Batch b) { return static_cast<int>(a) >= static_cast<int>(b) ? a : b; }

// The abstract value of one TorchScript value.
struct AVal {
  enum class Kind { kConst, kTensor, kList, kTuple, kFunction };
  Kind kind = Kind::kConst;
  c10::IValue value;            // kConst
  Batch batch = Batch::kNo;     // kConst: relation to the batch size
  std::string path;             // module state and objects: dotted attribute path from the root
  bool module_tensor = false;   // kConst: a parameter or buffer of a module (named by path)
  bool transposed = false;      // kConst: aten::t of a module tensor
  std::string tensor;           // kTensor: value name in the graph being built
  std::shared_ptr<std::vector<AVal>> items;  // kList (shared: lists are mutable) and kTuple
  jit::Function* function = nullptr;         // kFunction

  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_const() const { return kind == Kind::kConst; }
  bool is_none() const { return kind == Kind::kConst && value.isNone(); }
};

AVal const_val(c10::IValue v, Batch b = Batch::kNo) {
  AVal a;
  a.value = std::move(v);
  a.batch = b;
  return a;
}

AVal tensor_val(std::string name) {
  AVal a;
  a.kind = AVal::Kind::kTensor;
  a.tensor = std::move(name);
  return a;
}

AVal seq_val(AVal::Kind kind, std::vector<AVal> items) {
  AVal a;
  a.kind = kind;
  a.items = std::make_shared<std::vector<AVal>>(std::move(items));
  return a;
}

bool contains_tensor(const AVal& a) {
  if (a.is_tensor()) return true;
  if (a.items)
    for (const auto& i : *a.items)
      if (contains_tensor(i)) return true;
  return false;
}

bool contains_module_tensor(const AVal& a) {
  if (a.module_tensor) return true;
  if (a.items)
    for (const auto& i : *a.items)
      if (contains_module_tensor(i)) return true;
  return false;
}

Batch batch_of(const AVal& a) {
  Batch b = a.batch;
  if (a.items)
    for (const auto& i : *a.items) b = worst(b, batch_of(i));
  return b;
}

// The last component of a dotted path and everything before it ("a.b.weight" → "a.b", "weight").
std::pair<std::string, std::string> split_last(const std::string& path) {
  size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

std::string join_path(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

std::string first_line(const std::string& s) {
  size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// "file.py:12" for a node with a source range that names a file; empty otherwise. A loaded
// archive's ranges point into its serialized code; the Python source line that generated it
// (kept in the archive's debug information) is preferred when present.
std::string source_location(const jit::Node* n) {
  if (!n) return "";
  auto describe = [](const jit::SourceRange& r) -> std::string {
    auto flc = r.file_line_col();
    if (!flc || std::get<0>(*flc).empty()) return "";
    return std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc));
  };
  const jit::SourceRange& range = n->sourceRange();
  std::optional<jit::SourceRange> original = range.findSourceRangeThatGenerated();
  std::string source = original ? describe(*original) : "";
  return source.empty() ? describe(range) : source;
}

// One line of the node's IR text, without the trailing scope and source comments.
std::string node_text(const jit::Node* n) {
  std::ostringstream os;
  os << *n;
  std::string s = first_line(os.str());
  for (const char* cut : {", scope:", " # "}) {
    size_t p = s.find(cut);
    if (p != std::string::npos) s = s.substr(0, p);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == ':')) s.pop_back();
  size_t start = s.find_first_not_of(' ');
  return start == std::string::npos ? s : s.substr(start);
}

// The op kind without its namespace ("aten::relu_" → "relu_").
std::string unqualified(const jit::Node* n) { return n->kind().toUnqualString(); }

// In-place aten ops end in one underscore ("relu_", "add_"), unlike dunder ops ("__is__").
bool is_inplace(const jit::Node* n) {
  std::string u = unqualified(n);
  return n->kind().is_aten() && u.size() > 1 && u.back() == '_' && u.compare(0, 2, "__") != 0;
}

// A module call in the import: its dotted path, its class name, and where it was called.
struct Frame {
  int parent = -1;
  std::string path;
  std::string type_name;
  std::string call_site;
};

// A node of the graph under construction, with temporary name, its frame and (for nodes holding a
// module's weights) the module path that becomes its name.
struct Pending {
  Node node;
  int num_outputs = 1;
  int frame = 0;
  std::string fixed_name;
  bool removed = false;
};

// The arguments of the op being mapped.
struct Ctx {
  const jit::Node* n;
  int frame;
  std::vector<AVal>& in;
};

class Importer {
 public:
  Importer(const jit::Module& module, Shape shape, TorchScriptImportOptions options, std::string label)
      : module_(module), shape_(std::move(shape)), options_(options), label_(std::move(label)) {}

  Graph run();

 private:
  using Env = std::unordered_map<const jit::Value*, AVal>;

  std::vector<AVal> call_graph(const std::shared_ptr<jit::Graph>& graph, std::vector<AVal> args, int frame);
  void run_block(jit::Block* block, Env& env, int frame);
  void run_node(jit::Node* n, Env& env, int frame);
  std::vector<AVal> fold(const Ctx& c);
  std::vector<AVal> map_op(const Ctx& c);
  std::shared_ptr<jit::Graph> prepared(const std::shared_ptr<jit::Graph>& graph);

  [[noreturn]] void fail(const jit::Node* n, int frame, const std::string& what) const;
  [[noreturn]] void fail(const Ctx& c, const std::string& what) const { fail(c.n, c.frame, what); }
  std::string where(const jit::Node* n, int frame) const;

  // Argument access; each throws naming the op and argument when the value has another form.
  const AVal& arg(const Ctx& c, size_t i) const;
  c10::IValue const_arg(const Ctx& c, size_t i, const char* what) const;
  int64_t int_arg(const Ctx& c, size_t i, const char* what) const;
  double float_arg(const Ctx& c, size_t i, const char* what) const;
  bool bool_arg(const Ctx& c, size_t i, const char* what) const;
  std::vector<int64_t> ints_arg(const Ctx& c, size_t i, const char* what) const;
  std::vector<double> floats_arg(const Ctx& c, size_t i, const char* what) const;
  std::string tensor_arg(const Ctx& c, size_t i, const char* what) const;
  std::vector<std::string> tensor_list_arg(const Ctx& c, size_t i, const char* what) const;
  const AVal& module_tensor_arg(const Ctx& c, size_t i, const char* what) const;

  std::string resolve(std::string name) const;
  const Shape& shape_of(const std::string& value) const { return scratch_.value(value).shape; }
  int64_t wrap_dim(const Ctx& c, int64_t dim, size_t rank) const;

  // Adds a node to the graph under construction; returns its output value names.
  std::vector<std::string> emit(const Ctx& c, const std::string& op, std::vector<std::string> inputs,
                                std::map<std::string, Attr> attrs, int num_outputs = 1);
  // Adds a node holding module tensors: `params`/`buffers` map whittle names to the AVals used; all
  // must belong to one module, whose path names the node.
  std::string emit_weighted(const Ctx& c, const std::string& op, std::vector<std::string> inputs,
                            std::map<std::string, Attr> attrs, const std::vector<std::pair<std::string, const AVal*>>& params,
                            const std::vector<std::pair<std::string, const AVal*>>& buffers);

  // Op mappings.
  std::vector<AVal> map_conv(const Ctx& c);
  std::vector<AVal> map_batch_norm(const Ctx& c);
  std::vector<AVal> map_linear_like(const Ctx& c);
  std::vector<AVal> map_binary(const Ctx& c);
  std::vector<AVal> map_reshape(const Ctx& c);
  std::vector<AVal> map_split(const Ctx& c);
  std::vector<AVal> map_upsample(const Ctx& c);

  // Post-processing of the pending nodes.
  void fuse_channel_shuffles(const std::vector<std::string>& outputs);
  void remove_dead(const std::vector<std::string>& outputs);
  Graph build(const std::vector<std::string>& outputs);

  const jit::Module& module_;
  Shape shape_;
  TorchScriptImportOptions options_;
  std::string label_;

  Graph scratch_;  // nodes under temporary names, for shape inference while importing
  std::string scratch_input_ = "input";
  std::vector<Pending> pending_;
  std::map<std::string, size_t> pending_index_;  // temporary node name → index in pending_
  std::vector<Frame> frames_;
  std::map<std::string, c10::intrusive_ptr<c10::ivalue::Object>> modules_;  // path → module object
  std::set<std::string> claimed_;                                           // modules whose weights are in use
  std::map<std::string, std::string> mutated_;  // value → value replacing it after an in-place op
  std::map<const jit::Graph*, std::shared_ptr<jit::Graph>> prepared_;
  int next_tmp_ = 0;
  int depth_ = 0;
};

// ------------------------------------------------------------------------------------------ errors

// "in module 'layer3.1' of type BasicBlock, at model.py:12; 'layer3.1' called at model.py:40;
// node: %y : Tensor = aten::fft_fft2(...)".
std::string Importer::where(const jit::Node* n, int frame) const {
  std::ostringstream os;
  const Frame& f = frames_[static_cast<size_t>(frame)];
  os << "in " << (f.path.empty() ? std::string("the top-level module") : "module '" + f.path + "'");
  if (!f.type_name.empty()) os << " of type " << f.type_name;
  std::string loc = source_location(n);
  if (!loc.empty()) os << ", at " << loc;
  for (int i = frame; i > 0; i = frames_[static_cast<size_t>(i)].parent) {
    const Frame& fi = frames_[static_cast<size_t>(i)];
    if (!fi.call_site.empty()) os << "; '" << fi.path << "' called at " << fi.call_site;
  }
  if (n) os << "; node: " << node_text(n);
  return os.str();
}

void Importer::fail(const jit::Node* n, int frame, const std::string& what) const {
  throw Error("import_torchscript(" + label_ + "): " + what + " (" + where(n, frame) + ")");
}

// ------------------------------------------------------------------------------- argument access

const AVal& Importer::arg(const Ctx& c, size_t i) const {
  if (i >= c.in.size())
    fail(c, std::string(c.n->kind().toQualString()) + " has " + std::to_string(c.in.size()) + " arguments, expected more than " +
                std::to_string(i));
  return c.in[i];
}

c10::IValue Importer::const_arg(const Ctx& c, size_t i, const char* what) const {
  const AVal& a = arg(c, i);
  if (contains_tensor(a))
    fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is a computed tensor, expected a constant");
  if (batch_of(a) != Batch::kNo)
    fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what +
                "' depends on the batch size, which the whittle graph cannot express here");
  if (a.kind == AVal::Kind::kList || a.kind == AVal::Kind::kTuple) {
    std::vector<c10::IValue> items;
    for (const auto& it : *a.items) {
      if (!it.is_const()) fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a constant");
      items.push_back(it.value);
    }
    if (a.kind == AVal::Kind::kTuple) return c10::ivalue::Tuple::create(std::move(items));
    c10::impl::GenericList list(c10::AnyType::get());
    for (auto& it : items) list.push_back(std::move(it));
    return list;
  }
  if (a.kind == AVal::Kind::kFunction) fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is a function");
  return a.value;
}

int64_t Importer::int_arg(const Ctx& c, size_t i, const char* what) const {
  c10::IValue v = const_arg(c, i, what);
  if (v.isInt()) return v.toInt();
  if (v.isBool()) return v.toBool() ? 1 : 0;
  if (v.isTensor() && v.toTensor().numel() == 1 && !v.toTensor().is_floating_point()) return v.toTensor().item<int64_t>();
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not an integer (" + v.tagKind() + ")");
}

double Importer::float_arg(const Ctx& c, size_t i, const char* what) const {
  c10::IValue v = const_arg(c, i, what);
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a number (" + v.tagKind() + ")");
}

bool Importer::bool_arg(const Ctx& c, size_t i, const char* what) const {
  c10::IValue v = const_arg(c, i, what);
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt() != 0;
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a bool (" + v.tagKind() + ")");
}

std::vector<int64_t> Importer::ints_arg(const Ctx& c, size_t i, const char* what) const {
  c10::IValue v = const_arg(c, i, what);
  if (v.isInt()) return {v.toInt()};
  if (v.isList()) {
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isInt()) fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a list of integers");
      out.push_back(e.toInt());
    }
    return out;
  }
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a list of integers (" + v.tagKind() + ")");
}

std::vector<double> Importer::floats_arg(const Ctx& c, size_t i, const char* what) const {
  c10::IValue v = const_arg(c, i, what);
  if (v.isDouble()) return {v.toDouble()};
  if (v.isInt()) return {static_cast<double>(v.toInt())};
  if (v.isList()) {
    std::vector<double> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isDouble()) out.push_back(e.toDouble());
      else if (e.isInt()) out.push_back(static_cast<double>(e.toInt()));
      else fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a list of numbers");
    }
    return out;
  }
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a list of numbers (" + v.tagKind() + ")");
}

std::string Importer::resolve(std::string name) const {
  for (auto it = mutated_.find(name); it != mutated_.end(); it = mutated_.find(name)) name = it->second;
  return name;
}

std::string Importer::tensor_arg(const Ctx& c, size_t i, const char* what) const {
  const AVal& a = arg(c, i);
  if (a.is_tensor()) return resolve(a.tensor);
  std::string form = a.module_tensor ? "the module tensor '" + a.path + "'"
                     : a.is_const()  ? std::string("a constant (") + a.value.tagKind() + ")"
                                     : std::string("a list or tuple");
  fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is " + form +
              ", but whittle maps this op only with a computed tensor there");
}

std::vector<std::string> Importer::tensor_list_arg(const Ctx& c, size_t i, const char* what) const {
  const AVal& a = arg(c, i);
  if (a.kind != AVal::Kind::kList && a.kind != AVal::Kind::kTuple)
    fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what + "' is not a list of computed tensors");
  std::vector<std::string> out;
  for (const auto& it : *a.items) {
    if (!it.is_tensor())
      fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what +
                  "' holds a constant or parameter tensor; only computed tensors can be mapped");
    out.push_back(resolve(it.tensor));
  }
  return out;
}

const AVal& Importer::module_tensor_arg(const Ctx& c, size_t i, const char* what) const {
  const AVal& a = arg(c, i);
  if (!a.is_const() || !a.module_tensor || !a.value.isTensor())
    fail(c, std::string(c.n->kind().toQualString()) + ": argument '" + what +
                "' must be a parameter or buffer of a module (whittle stores weights in the node that uses them)");
  return a;
}

int64_t Importer::wrap_dim(const Ctx& c, int64_t dim, size_t rank) const {
  const auto r = static_cast<int64_t>(rank);
  int64_t d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    fail(c, std::string(c.n->kind().toQualString()) + ": dimension " + std::to_string(dim) + " out of range for rank " +
                std::to_string(rank));
  return d;
}

// ------------------------------------------------------------------------------------- emission

std::vector<std::string> Importer::emit(const Ctx& c, const std::string& op, std::vector<std::string> inputs,
                                        std::map<std::string, Attr> attrs, int num_outputs) {
  Node node;
  node.name = "t" + std::to_string(next_tmp_++);
  node.op = op;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  try {
    scratch_.add_node(node, num_outputs);
  } catch (const Error& e) {
    fail(c, std::string("cannot map ") + c.n->kind().toQualString() + " onto '" + op + "': " + e.what());
  }
  Pending p;
  p.node = scratch_.node(node.name);
  p.num_outputs = num_outputs;
  p.frame = c.frame;
  pending_index_[node.name] = pending_.size();
  pending_.push_back(p);
  return pending_.back().node.outputs;
}

std::string Importer::emit_weighted(const Ctx& c, const std::string& op, std::vector<std::string> inputs,
                                    std::map<std::string, Attr> attrs,
                                    const std::vector<std::pair<std::string, const AVal*>>& params,
                                    const std::vector<std::pair<std::string, const AVal*>>& buffers) {
  std::string owner;
  bool first = true;
  auto check_owner = [&](const std::string& expected, const AVal& a) {
    auto [parent, key] = split_last(a.path);
    if (key != expected)
      fail(c, "the " + op + " " + expected + " is the module tensor '" + a.path + "'; whittle names it '" + expected +
                  "', so the state_dict key would change");
    if (first) owner = parent;
    else if (parent != owner)
      fail(c, "the " + op + " uses tensors of two modules ('" + owner + "' and '" + parent +
                  "'); whittle keeps a node's weights in one module");
    first = false;
  };
  for (const auto& [name, a] : params) check_owner(name, *a);
  for (const auto& [name, a] : buffers) check_owner(name, *a);
  if (owner.empty())
    fail(c, "the " + op + " uses weights of the top-level module itself; whittle names a node after the module holding "
                "its weights, so they must live in a submodule");
  if (!claimed_.insert(owner).second)
    fail(c, "module '" + owner + "' is called more than once; whittle graphs do not share weights between nodes");

  Node node;
  node.name = "t" + std::to_string(next_tmp_++);
  node.op = op;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  for (const auto& [name, a] : params) node.params.set(name, a->value.toTensor().detach().clone().set_requires_grad(true));
  for (const auto& [name, a] : buffers) node.buffers.set(name, a->value.toTensor().detach().clone());
  if (op == "batch_norm") {
    auto mod = modules_.find(owner);
    if (mod != modules_.end()) {
      auto slot = mod->second->type()->findAttributeSlot("num_batches_tracked");
      if (slot) {
        c10::IValue nbt = mod->second->getSlot(*slot);
        if (nbt.isTensor()) node.buffers.set("num_batches_tracked", nbt.toTensor().detach().clone());
      }
    }
  }
  try {
    scratch_.add_node(node);
  } catch (const Error& e) {
    fail(c, std::string("cannot map ") + c.n->kind().toQualString() + " onto '" + op + "': " + e.what());
  }
  Pending p;
  p.node = scratch_.node(node.name);
  p.frame = c.frame;
  p.fixed_name = owner;
  pending_index_[node.name] = pending_.size();
  pending_.push_back(p);
  return pending_.back().node.outputs[0];
}

// ---------------------------------------------------------------------------------- interpretation

std::shared_ptr<jit::Graph> Importer::prepared(const std::shared_ptr<jit::Graph>& graph) {
  auto it = prepared_.find(graph.get());
  if (it != prepared_.end()) return it->second;
  std::shared_ptr<jit::Graph> copy = graph->copy();
  jit::EliminateDeadCode(copy);
  prepared_[graph.get()] = copy;
  return copy;
}

std::vector<AVal> Importer::call_graph(const std::shared_ptr<jit::Graph>& graph, std::vector<AVal> args, int frame) {
  if (++depth_ > 200) throw Error("import_torchscript(" + label_ + "): calls nest deeper than 200 (recursion?)");
  std::shared_ptr<jit::Graph> g = prepared(graph);
  if (g->inputs().size() != args.size())
    throw Error("import_torchscript(" + label_ + "): a graph takes " + std::to_string(g->inputs().size()) + " inputs, got " +
                std::to_string(args.size()) + " (" + where(nullptr, frame) + ")");
  Env env;
  for (size_t i = 0; i < args.size(); ++i) env[g->inputs()[i]] = std::move(args[i]);
  run_block(g->block(), env, frame);
  std::vector<AVal> out;
  for (const jit::Value* v : g->outputs()) out.push_back(env.at(v));
  --depth_;
  return out;
}

void Importer::run_block(jit::Block* block, Env& env, int frame) {
  for (jit::Node* n : block->nodes()) run_node(n, env, frame);
}

void Importer::run_node(jit::Node* n, Env& env, int frame) {
  const c10::Symbol kind = n->kind();
  auto set = [&](size_t i, AVal v) { env[n->outputs()[i]] = std::move(v); };

  if (kind == c10::prim::Constant) {
    const jit::Value* out = n->output();
    if (auto ft = out->type()->cast<c10::FunctionType>()) {
      AVal a;
      a.kind = AVal::Kind::kFunction;
      a.function = ft->function();
      set(0, a);
      return;
    }
    std::optional<c10::IValue> v = jit::toIValue(out);
    if (!v) fail(n, frame, "cannot read constant");
    set(0, const_val(*v));
    return;
  }

  std::vector<AVal> in;
  in.reserve(n->inputs().size());
  for (const jit::Value* v : n->inputs()) {
    auto it = env.find(v);
    if (it == env.end()) fail(n, frame, "internal: value %" + v->debugName() + " used before it was computed");
    in.push_back(it->second);
  }
  Ctx c{n, frame, in};

  if (kind == c10::prim::GetAttr) {
    const std::string name = n->s(c10::attr::name);
    if (!in[0].is_const() || !in[0].value.isObject()) fail(n, frame, "prim::GetAttr on a value that is not an object");
    auto obj = in[0].value.toObject();
    const auto& type = obj->type();
    if (name == "training" && type->is_module()) {
      set(0, const_val(false));  // imported in eval-mode form; whittle ops switch at run time
      return;
    }
    auto slot = type->findAttributeSlot(name);
    if (!slot) fail(n, frame, "object has no attribute '" + name + "'");
    AVal a = const_val(obj->getSlot(*slot));
    a.path = join_path(in[0].path, name);
    if (a.value.isTensor() && type->is_module() && (type->is_parameter(*slot) || type->is_buffer(*slot)))
      a.module_tensor = true;
    if (a.value.isObject()) modules_[a.path] = a.value.toObject();
    set(0, a);
    return;
  }
  if (kind == c10::prim::SetAttr) fail(n, frame, "unsupported op prim::SetAttr (the forward changes module state)");

  if (kind == c10::prim::CallMethod) {
    if (!in[0].is_const() || !in[0].value.isObject()) fail(n, frame, "prim::CallMethod on a value that is not an object");
    auto obj = in[0].value.toObject();
    const std::string method = n->s(c10::attr::name);
    jit::Function* fn = obj->type()->findMethod(method);
    if (!fn) fail(n, frame, "object has no method '" + method + "'");
    int callee_frame = frame;
    if (in[0].path != frames_[frame].path) {
      Frame f;
      f.parent = frame;
      f.path = in[0].path;
      if (auto qn = obj->type()->name()) f.type_name = qn->name();
      f.call_site = source_location(n);
      frames_.push_back(f);
      callee_frame = static_cast<int>(frames_.size()) - 1;
    }
    std::vector<AVal> out = call_graph(jit::toGraphFunction(*fn).graph(), in, callee_frame);
    for (size_t i = 0; i < out.size(); ++i) set(i, out[i]);
    return;
  }
  if (kind == c10::prim::CallFunction) {
    if (in[0].kind != AVal::Kind::kFunction) fail(n, frame, "prim::CallFunction of a value that is not a function");
    std::vector<AVal> args(in.begin() + 1, in.end());
    std::vector<AVal> out = call_graph(jit::toGraphFunction(*in[0].function).graph(), std::move(args), frame);
    for (size_t i = 0; i < out.size(); ++i) set(i, out[i]);
    return;
  }
  if (kind == c10::prim::If) {
    bool cond = bool_arg(c, 0, "condition");
    jit::Block* b = n->blocks()[cond ? 0 : 1];
    run_block(b, env, frame);
    for (size_t i = 0; i < n->outputs().size(); ++i) set(i, env.at(b->outputs()[i]));
    return;
  }
  if (kind == c10::prim::Loop) {
    int64_t trips = int_arg(c, 0, "max_trip_count");
    bool cond = bool_arg(c, 1, "initial_condition");
    jit::Block* b = n->blocks()[0];
    std::vector<AVal> carried(in.begin() + 2, in.end());
    for (int64_t i = 0; cond && i < trips; ++i) {
      if (i >= 100000) fail(n, frame, "prim::Loop runs more than 100000 iterations");
      env[b->inputs()[0]] = const_val(i);
      for (size_t k = 0; k < carried.size(); ++k) env[b->inputs()[k + 1]] = carried[k];
      run_block(b, env, frame);
      const AVal& cv = env.at(b->outputs()[0]);
      if (!cv.is_const() || cv.batch != Batch::kNo || !cv.value.isBool())
        fail(n, frame, "prim::Loop condition is not a constant");
      cond = cv.value.toBool();
      for (size_t k = 0; k < carried.size(); ++k) carried[k] = env.at(b->outputs()[k + 1]);
    }
    for (size_t k = 0; k < carried.size(); ++k) set(k, carried[k]);
    return;
  }
  if (kind == c10::prim::RaiseException)
    fail(n, frame, "the module raises an exception for input shape " + shape_str(shape_) + " (" +
                       (in.empty() || !in[0].value.isString() ? std::string("no message") : in[0].value.toStringRef()) + ")");
  if (kind == c10::prim::Print || kind == c10::aten::warn) return;
  if (kind == c10::prim::ListConstruct) {
    set(0, seq_val(AVal::Kind::kList, in));
    return;
  }
  if (kind == c10::prim::TupleConstruct) {
    set(0, seq_val(AVal::Kind::kTuple, in));
    return;
  }
  if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
    std::vector<AVal> items;
    if (in[0].items) {
      items = *in[0].items;
    } else if (in[0].is_const() && (in[0].value.isList() || in[0].value.isTuple())) {
      auto elems = in[0].value.isList() ? in[0].value.toListRef().vec() : in[0].value.toTupleRef().elements().vec();
      for (auto& e : elems) items.push_back(const_val(e, in[0].batch));
    } else {
      fail(n, frame, "cannot unpack a value that is not a list or tuple");
    }
    if (items.size() != n->outputs().size())
      fail(n, frame, "unpacks " + std::to_string(n->outputs().size()) + " values from " + std::to_string(items.size()));
    for (size_t i = 0; i < items.size(); ++i) set(i, items[i]);
    return;
  }
  if ((kind == c10::aten::__getitem__ || kind == c10::prim::TupleIndex) && in[0].items) {
    int64_t i = int_arg(c, 1, "index");
    const auto size = static_cast<int64_t>(in[0].items->size());
    if (i < 0) i += size;
    if (i < 0 || i >= size) fail(n, frame, "index " + std::to_string(i) + " out of range for " + std::to_string(size) + " items");
    set(0, (*in[0].items)[static_cast<size_t>(i)]);
    return;
  }
  if (kind == c10::aten::len && in[0].items) {
    set(0, const_val(static_cast<int64_t>(in[0].items->size())));
    return;
  }
  if (kind == c10::aten::append && in[0].kind == AVal::Kind::kList) {
    in[0].items->push_back(in[1]);
    set(0, in[0]);
    return;
  }
  if (kind == c10::aten::list && in[0].kind == AVal::Kind::kList) {
    set(0, seq_val(AVal::Kind::kList, *in[0].items));
    return;
  }
  if (kind == c10::prim::unchecked_cast || kind == c10::aten::contiguous) {
    set(0, in[0]);
    return;
  }
  if ((kind == c10::aten::__is__ || kind == c10::aten::__isnot__) && (!in[0].is_const() || !in[1].is_const())) {
    // A computed tensor, list or function is never None and never identical to a constant.
    bool same = false;
    set(0, const_val(kind == c10::aten::__is__ ? same : !same));
    return;
  }

  // Queries on computed tensors, answered from the static shape.
  if (!in.empty() && in[0].is_tensor()) {
    const Shape& s = shape_of(resolve(in[0].tensor));
    if (kind == c10::aten::size && in.size() == 1) {
      std::vector<AVal> dims;
      for (size_t i = 0; i < s.size(); ++i) dims.push_back(const_val(s[i], i == 0 ? Batch::kExact : Batch::kNo));
      set(0, seq_val(AVal::Kind::kList, dims));
      return;
    }
    if (kind == c10::aten::size && in.size() == 2) {
      int64_t d = wrap_dim(c, int_arg(c, 1, "dim"), s.size());
      set(0, const_val(s[static_cast<size_t>(d)], d == 0 ? Batch::kExact : Batch::kNo));
      return;
    }
    if (kind == c10::aten::dim) {
      set(0, const_val(static_cast<int64_t>(s.size())));
      return;
    }
    if (kind == c10::Symbol::fromQualString("aten::numel")) {
      int64_t p = 1;
      for (int64_t d : s) p *= d;
      set(0, const_val(p, Batch::kDerived));
      return;
    }
    if (kind == c10::prim::dtype) {
      set(0, const_val(static_cast<int64_t>(at::kFloat)));
      return;
    }
    if (kind == c10::prim::device) {
      set(0, const_val(c10::Device(c10::kCPU)));
      return;
    }
  }

  std::vector<AVal> out;
  bool dynamic = false;
  for (const auto& a : in) dynamic = dynamic || contains_tensor(a);
  if (!dynamic) {
    if (kind == c10::aten::t && in.size() == 1 && in[0].module_tensor) {
      AVal a = in[0];
      a.transposed = !a.transposed;
      set(0, a);
      return;
    }
    if (is_inplace(n) && in[0].module_tensor) {
      // BatchNorm's num_batches_tracked += 1 (train-mode graphs): the batch_norm node counts itself.
      if (split_last(in[0].path).second == "num_batches_tracked" && kind == c10::aten::add_) {
        set(0, in[0]);
        return;
      }
      fail(n, frame, std::string("unsupported op ") + kind.toQualString() + " (changes the module tensor '" + in[0].path + "')");
    }
    out = fold(c);
  } else {
    out = map_op(c);
    if (is_inplace(n) && in[0].is_tensor() && !out.empty() && out[0].is_tensor()) {
      std::string old = resolve(in[0].tensor);
      if (old != out[0].tensor) mutated_[old] = out[0].tensor;
    }
  }
  if (out.size() != n->outputs().size())
    fail(n, frame, "internal: produced " + std::to_string(out.size()) + " values for " + std::to_string(n->outputs().size()) +
                       " outputs");
  for (size_t i = 0; i < out.size(); ++i) set(i, out[i]);
}

// Runs an op on constant arguments through the JIT operator registry.
std::vector<AVal> Importer::fold(const Ctx& c) {
  const c10::Symbol kind = c.n->kind();
  static const std::set<std::string> queries = {"aten::size", "aten::dim", "aten::__is__", "aten::__isnot__", "prim::dtype",
                                                "prim::device", "aten::len", "aten::numel", "prim::shape", "aten::__getitem__"};
  for (const auto& a : c.in)
    if (contains_module_tensor(a) && !queries.count(kind.toQualString()))
      fail(c, std::string("unsupported op ") + kind.toQualString() + " on the module tensor '" + a.path +
                  "' (whittle imports weights only as the parameters of the ops that use them)");
  Batch b = Batch::kNo;
  jit::Stack stack;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const AVal& a = c.in[i];
    b = worst(b, batch_of(a));
    if (a.kind == AVal::Kind::kFunction) fail(c, std::string("unsupported op ") + kind.toQualString() + " on a function value");
    if (a.is_const()) {
      stack.push_back(a.value);
      continue;
    }
    // A list or tuple of constants: rebuild it with the element type the op expects.
    std::vector<c10::IValue> items;
    for (const auto& it : *a.items) {
      if (!it.is_const()) fail(c, std::string("unsupported op ") + kind.toQualString() + " on a nested list");
      items.push_back(it.value);
    }
    if (a.kind == AVal::Kind::kTuple) {
      stack.emplace_back(c10::ivalue::Tuple::create(std::move(items)));
    } else {
      c10::TypePtr elem = c10::AnyType::get();
      if (auto lt = c.n->inputs()[i]->type()->cast<c10::ListType>()) elem = lt->getElementType();
      c10::impl::GenericList list(elem);
      for (auto& it : items) list.push_back(std::move(it));
      stack.emplace_back(std::move(list));
    }
  }
  // Casts and identities keep "equals the batch size"; any other arithmetic on it is derived.
  static const std::set<std::string> keep_exact = {"prim::NumToTensor", "aten::Int", "aten::IntImplicit", "aten::ScalarImplicit",
                                                   "aten::Float", "aten::FloatImplicit", "aten::detach", "aten::clone",
                                                   "aten::__getitem__", "prim::TupleIndex"};
  if (b == Batch::kExact && !keep_exact.count(kind.toQualString())) b = Batch::kDerived;
  if (kind == c10::aten::__getitem__ && b == Batch::kExact) b = Batch::kDerived;  // a constant list with a batch entry
  if (!c.n->maybeOperator())
    fail(c, std::string("unsupported op ") + kind.toQualString() + " (no operator to evaluate it with constant arguments)");
  try {
    jit::Operation op = c.n->getOperation();
    op(stack);
  } catch (const std::exception& e) {
    fail(c, std::string("evaluating ") + kind.toQualString() + " on constant arguments failed: " + first_line(e.what()));
  }
  if (stack.size() != c.n->outputs().size())
    fail(c, std::string("evaluating ") + kind.toQualString() + " returned " + std::to_string(stack.size()) + " values");
  std::vector<AVal> out;
  for (auto& v : stack) out.push_back(const_val(std::move(v), b));
  return out;
}

// ---------------------------------------------------------------------------------- op mappings

std::vector<AVal> Importer::map_op(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  // Which whittle op an operator maps onto is in the op registry (OpTraits::torchscript_ops); how
  // its arguments become attributes is below.
  const std::string op = op_for_torchscript(k);
  if (op.empty()) fail(c, "unsupported op " + k);
  auto unary = [&](const std::string& op, std::map<std::string, Attr> attrs = {}) {
    return std::vector<AVal>{tensor_val(emit(c, op, {tensor_arg(c, 0, "input")}, std::move(attrs))[0])};
  };

  if (op == "conv2d" || op == "conv_transpose2d") return map_conv(c);
  if (op == "batch_norm") return map_batch_norm(c);
  if (op == "linear") return map_linear_like(c);
  if (op == "add" || op == "mul") return map_binary(c);
  if (op == "reshape") return map_reshape(c);
  if (op == "split")
    return map_split(c);
  if (op == "upsample") return map_upsample(c);

  if (op == "identity") return unary("identity");  // aten::clone
  if (op == "relu") return unary("relu");
  if (op == "relu6") return unary("relu6");
  if (op == "hardtanh") {
    double lo = float_arg(c, 1, "min_val"), hi = float_arg(c, 2, "max_val");
    if (lo == 0.0 && hi == 6.0) return unary("relu6");
    return unary("hardtanh", {{"min_val", lo}, {"max_val", hi}});
  }
  if (op == "leaky_relu") return unary("leaky_relu", {{"negative_slope", float_arg(c, 1, "negative_slope")}});
  for (const char* u : {"sigmoid", "tanh", "silu", "hardswish", "hardsigmoid"})
    if (op == u) return unary(u);
  if (op == "gelu") {
    std::string approx = "none";
    if (c.in.size() > 1) {
      c10::IValue a = const_arg(c, 1, "approximate");
      if (a.isString()) approx = a.toStringRef();
    }
    return unary("gelu", {{"approximate", approx}});
  }
  if (op == "dropout" || op == "feature_dropout") return unary(op, {{"p", float_arg(c, 1, "p")}});
  if (op == "softmax") {
    if (c.in.size() > 2 && !c.in[2].is_none()) fail(c, "aten::softmax with a dtype argument is not supported");
    return unary("softmax", {{"dim", int_arg(c, 1, "dim")}});
  }
  if (op == "max_pool2d") {
    std::map<std::string, Attr> a{{"kernel_size", ints_arg(c, 1, "kernel_size")}};
    std::vector<int64_t> stride = ints_arg(c, 2, "stride");
    if (!stride.empty()) a["stride"] = stride;
    a["padding"] = ints_arg(c, 3, "padding");
    a["dilation"] = ints_arg(c, 4, "dilation");
    a["ceil_mode"] = int64_t{bool_arg(c, 5, "ceil_mode")};
    return unary("max_pool2d", a);
  }
  if (op == "avg_pool2d") {
    std::map<std::string, Attr> a{{"kernel_size", ints_arg(c, 1, "kernel_size")}};
    std::vector<int64_t> stride = ints_arg(c, 2, "stride");
    if (!stride.empty()) a["stride"] = stride;
    a["padding"] = ints_arg(c, 3, "padding");
    a["ceil_mode"] = int64_t{bool_arg(c, 4, "ceil_mode")};
    a["count_include_pad"] = int64_t{bool_arg(c, 5, "count_include_pad")};
    if (c.in.size() > 6 && !c.in[6].is_none()) a["divisor_override"] = int_arg(c, 6, "divisor_override");
    return unary("avg_pool2d", a);
  }
  if (op == "adaptive_avg_pool2d") return unary("adaptive_avg_pool2d", {{"output_size", ints_arg(c, 1, "output_size")}});
  if (op == "flatten") {
    std::string x = tensor_arg(c, 0, "input");
    int64_t s = int_arg(c, 1, "start_dim"), e = int_arg(c, 2, "end_dim");
    if (wrap_dim(c, s, shape_of(x).size()) == 0)
      fail(c, "aten::flatten over the batch dimension is not supported (the graph must stay batch-independent)");
    return {tensor_val(emit(c, "flatten", {x}, {{"start_dim", s}, {"end_dim", e}})[0])};
  }
  if (op == "cat") {
    std::vector<std::string> xs = tensor_list_arg(c, 0, "tensors");
    if (xs.empty()) fail(c, "aten::cat of an empty list");
    int64_t d = int_arg(c, 1, "dim");
    if (wrap_dim(c, d, shape_of(xs[0]).size()) == 0) fail(c, "aten::cat along the batch dimension is not supported");
    return {tensor_val(emit(c, "cat", xs, {{"dim", d}})[0])};
  }
  if (op == "transpose") {
    std::string x = tensor_arg(c, 0, "input");
    size_t rank = shape_of(x).size();
    int64_t d0 = wrap_dim(c, int_arg(c, 1, "dim0"), rank), d1 = wrap_dim(c, int_arg(c, 2, "dim1"), rank);
    if (d0 == 0 || d1 == 0) fail(c, "aten::transpose of the batch dimension is not supported");
    return {tensor_val(emit(c, "transpose", {x}, {{"dim0", d0}, {"dim1", d1}})[0])};
  }
  if (op == "permute") {
    std::string x = tensor_arg(c, 0, "input");
    std::vector<int64_t> dims = ints_arg(c, 1, "dims");
    for (auto& d : dims) d = wrap_dim(c, d, shape_of(x).size());
    if (dims.empty() || dims[0] != 0) fail(c, "aten::permute that moves the batch dimension is not supported");
    return {tensor_val(emit(c, "permute", {x}, {{"dims", dims}})[0])};
  }
  if (op == "mean") {
    std::string x = tensor_arg(c, 0, "input");
    if (c.in.size() < 3) fail(c, "aten::mean over all elements mixes the batch dimension; not supported");
    std::vector<int64_t> dims = ints_arg(c, 1, "dim");
    for (auto& d : dims) d = wrap_dim(c, d, shape_of(x).size());
    if (std::find(dims.begin(), dims.end(), 0) != dims.end())
      fail(c, "aten::mean over the batch dimension is not supported");
    if (c.in.size() > 3 && !c.in[3].is_none()) fail(c, "aten::mean with a dtype argument is not supported");
    return {tensor_val(emit(c, "mean", {x}, {{"dims", dims}, {"keepdim", int64_t{bool_arg(c, 2, "keepdim")}}})[0])};
  }
  fail(c, "op " + k + " maps onto " + op + ", which the importer cannot read yet");
}

std::vector<AVal> Importer::map_conv(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  std::string x = tensor_arg(c, 0, "input");
  const AVal& w = module_tensor_arg(c, 1, "weight");
  if (w.transposed) fail(c, k + ": transposed weight tensor");
  const AVal* b = c.in.size() > 2 && !c.in[2].is_none() ? &module_tensor_arg(c, 2, "bias") : nullptr;
  if (w.value.toTensor().dim() != 4) fail(c, k + ": only 2-D convolutions are supported (weight " +
                                                 shape_str(w.value.toTensor().sizes().vec()) + ")");
  bool transposed = k == "aten::conv_transpose2d";
  std::map<std::string, Attr> a;
  a["stride"] = ints_arg(c, 3, "stride");
  if (k == "aten::_convolution") {
    a["padding"] = ints_arg(c, 4, "padding");
    a["dilation"] = ints_arg(c, 5, "dilation");
    transposed = bool_arg(c, 6, "transposed");
    if (transposed) a["output_padding"] = ints_arg(c, 7, "output_padding");
    a["groups"] = int_arg(c, 8, "groups");
  } else if (k == "aten::conv2d") {
    a["dilation"] = ints_arg(c, 5, "dilation");
    a["groups"] = int_arg(c, 6, "groups");
    c10::IValue pad = const_arg(c, 4, "padding");
    if (pad.isString()) {
      // padding="valid" | "same" (stride 1): symmetric zero padding when the total is even.
      const std::string mode = pad.toStringRef();
      std::vector<int64_t> p{0, 0};
      if (mode == "same") {
        auto dil = std::get<std::vector<int64_t>>(a["dilation"]);
        if (dil.size() == 1) dil.push_back(dil[0]);
        for (int i = 0; i < 2; ++i) {
          int64_t total = dil[static_cast<size_t>(i)] * (w.value.toTensor().size(2 + i) - 1);
          if (total % 2) fail(c, "aten::conv2d padding='same' with an even kernel needs asymmetric padding; not supported");
          p[static_cast<size_t>(i)] = total / 2;
        }
      } else if (mode != "valid") {
        fail(c, "aten::conv2d padding='" + mode + "' is not supported");
      }
      a["padding"] = p;
    } else {
      a["padding"] = ints_arg(c, 4, "padding");
    }
  } else {  // conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    a["padding"] = ints_arg(c, 4, "padding");
    a["output_padding"] = ints_arg(c, 5, "output_padding");
    a["groups"] = int_arg(c, 6, "groups");
    a["dilation"] = ints_arg(c, 7, "dilation");
  }
  std::vector<std::pair<std::string, const AVal*>> params{{"weight", &w}};
  if (b) params.emplace_back("bias", b);
  return {tensor_val(emit_weighted(c, transposed ? "conv_transpose2d" : "conv2d", {x}, a, params, {}))};
}

std::vector<AVal> Importer::map_batch_norm(const Ctx& c) {
  // batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps, cudnn_enabled)
  std::string x = tensor_arg(c, 0, "input");
  if (c.in[3].is_none() || c.in[4].is_none())
    fail(c, "aten::batch_norm without running statistics (track_running_stats=False) is not supported");
  std::vector<std::pair<std::string, const AVal*>> params, buffers;
  if (!c.in[1].is_none()) params.emplace_back("weight", &module_tensor_arg(c, 1, "weight"));
  if (!c.in[2].is_none()) params.emplace_back("bias", &module_tensor_arg(c, 2, "bias"));
  buffers.emplace_back("running_mean", &module_tensor_arg(c, 3, "running_mean"));
  buffers.emplace_back("running_var", &module_tensor_arg(c, 4, "running_var"));
  std::map<std::string, Attr> a{{"momentum", float_arg(c, 6, "momentum")}, {"eps", float_arg(c, 7, "eps")}};
  return {tensor_val(emit_weighted(c, "batch_norm", {x}, a, params, buffers))};
}

std::vector<AVal> Importer::map_linear_like(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  if (k == "aten::linear") {
    std::string x = tensor_arg(c, 0, "input");
    const AVal& w = module_tensor_arg(c, 1, "weight");
    if (w.transposed) fail(c, "aten::linear with a transposed weight is not supported");
    std::vector<std::pair<std::string, const AVal*>> params{{"weight", &w}};
    if (c.in.size() > 2 && !c.in[2].is_none()) params.emplace_back("bias", &module_tensor_arg(c, 2, "bias"));
    return {tensor_val(emit_weighted(c, "linear", {x}, {}, params, {}))};
  }
  if (k == "aten::addmm") {
    // addmm(bias, x, weight.t(), beta, alpha) = beta·bias + alpha·x·Wᵀ: a linear layer when beta = alpha = 1.
    const AVal& b = module_tensor_arg(c, 0, "bias");
    std::string x = tensor_arg(c, 1, "mat1");
    const AVal& w = module_tensor_arg(c, 2, "mat2");
    if (!w.transposed) fail(c, "aten::addmm whose mat2 is not a transposed weight (weight.t()) is not supported");
    if (float_arg(c, 3, "beta") != 1.0 || float_arg(c, 4, "alpha") != 1.0)
      fail(c, "aten::addmm with beta or alpha other than 1 is not supported");
    return {tensor_val(emit_weighted(c, "linear", {x}, {}, {{"weight", &w}, {"bias", &b}}, {}))};
  }
  // matmul / mm(x, weight.t()): a linear layer without bias (a following add of the bias folds in).
  std::string x = tensor_arg(c, 0, "input");
  const AVal& w = module_tensor_arg(c, 1, "other");
  if (!w.transposed || w.value.toTensor().dim() != 2)
    fail(c, k + " is mapped only as x·weight.t() with a 2-D module weight (a linear layer)");
  return {tensor_val(emit_weighted(c, "linear", {x}, {}, {{"weight", &w}}, {}))};
}

std::vector<AVal> Importer::map_binary(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  const bool is_add = k == "aten::add" || k == "aten::add_";
  const std::string op = is_add ? "add" : "mul";
  if (is_add && c.in.size() > 2 && float_arg(c, 2, "alpha") != 1.0) fail(c, k + " with alpha other than 1 is not supported");
  const AVal& a = arg(c, 0);
  const AVal& b = arg(c, 1);
  if (a.is_tensor() && b.is_tensor())
    return {tensor_val(emit(c, op, {tensor_arg(c, 0, "self"), tensor_arg(c, 1, "other")}, {})[0])};
  if (is_add && a.is_tensor() && b.module_tensor && !b.transposed) {
    // x·Wᵀ + b after matmul/mm: set the bias of that linear node when it is the only use.
    std::string x = resolve(a.tensor);
    const ValueInfo& info = scratch_.value(x);
    auto it = pending_index_.find(info.producer);
    if (it != pending_index_.end()) {
      Pending& p = pending_[it->second];
      auto [owner, key] = split_last(b.path);
      if (p.node.op == "linear" && !p.node.params.contains("bias") && owner == p.fixed_name && key == "bias" &&
          c.n->inputs()[0]->uses().size() == 1 && scratch_.users(x).empty()) {
        at::Tensor bias = b.value.toTensor().detach().clone().set_requires_grad(true);
        p.node.params.set("bias", bias);
        scratch_.node(p.node.name).params.set("bias", bias);
        try {
          scratch_.validate();
        } catch (const Error& e) {
          fail(c, std::string("cannot fold the bias into the linear layer: ") + e.what());
        }
        return {tensor_val(x)};
      }
    }
  }
  fail(c, k + " is mapped only for two computed tensors (whittle has no op adding or multiplying by a constant or "
              "parameter)");
}

std::vector<AVal> Importer::map_reshape(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  std::string x = tensor_arg(c, 0, "input");
  const AVal& s = arg(c, 1);
  std::vector<std::pair<int64_t, Batch>> dims;
  if (s.items) {
    for (const auto& it : *s.items) {
      if (!it.is_const() || !it.value.isInt()) fail(c, k + ": the shape is not a list of integers");
      dims.emplace_back(it.value.toInt(), it.batch);
    }
  } else if (s.is_const() && s.value.isList()) {
    for (const auto& e : s.value.toListRef()) dims.emplace_back(e.toInt(), s.batch);
  } else {
    fail(c, k + ": the shape is not a list of integers");
  }
  if (dims.empty()) fail(c, k + " to a scalar is not supported");
  std::vector<int64_t> rest;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i].second != Batch::kNo)
      fail(c, k + ": size " + std::to_string(i) + " depends on the batch size; whittle's reshape keeps dim 0 as the batch");
    rest.push_back(dims[i].first);
  }
  const bool batch_first = dims[0].second == Batch::kExact ||
                           (dims[0].second == Batch::kNo && dims[0].first == -1 &&
                            std::find(rest.begin(), rest.end(), -1) == rest.end());
  if (!batch_first)
    fail(c, k + " with leading size " + std::to_string(dims[0].first) +
                " fixes or mixes the batch dimension (use x.size(0) or -1 as the first size)");
  return {tensor_val(emit(c, "reshape", {x}, {{"shape", rest}})[0])};
}

std::vector<AVal> Importer::map_split(const Ctx& c) {
  const std::string k = c.n->kind().toQualString();
  std::string x = tensor_arg(c, 0, "input");
  const Shape& s = shape_of(x);
  int64_t d = wrap_dim(c, int_arg(c, 2, "dim"), s.size());
  if (d == 0) fail(c, k + " along the batch dimension is not supported");
  const int64_t size = s[static_cast<size_t>(d)];
  std::vector<int64_t> sizes;
  auto even = [&](int64_t each) {
    if (each <= 0) fail(c, k + ": split size must be positive");
    for (int64_t left = size; left > 0; left -= each) sizes.push_back(std::min(each, left));
    if (sizes.empty()) sizes.push_back(0);
  };
  if (k == "aten::chunk" || k == "aten::unsafe_chunk") {
    int64_t chunks = int_arg(c, 1, "chunks");
    if (chunks <= 0) fail(c, k + ": chunks must be positive");
    even((size + chunks - 1) / chunks);
  } else {
    c10::IValue v = const_arg(c, 1, "split_size");
    if (v.isInt()) even(v.toInt());
    else sizes = ints_arg(c, 1, "split_sizes");
  }
  const int n = static_cast<int>(sizes.size());
  std::vector<std::string> outs = emit(c, "split", {x}, {{"dim", d}, {"split_sizes", sizes}}, n);
  std::vector<AVal> items;
  for (const auto& o : outs) items.push_back(tensor_val(o));
  return {seq_val(AVal::Kind::kList, items)};
}

std::vector<AVal> Importer::map_upsample(const Ctx& c) {
  // upsample_nearest2d(input, output_size?, scale_factors?) | (input, output_size, scales_h?, scales_w?)
  // upsample_bilinear2d(input, output_size?, align_corners, scale_factors?) | (input, output_size, align_corners, scales_h?, scales_w?)
  const std::string k = c.n->kind().toQualString();
  const bool bilinear = k == "aten::upsample_bilinear2d";
  std::string x = tensor_arg(c, 0, "input");
  std::map<std::string, Attr> a{{"mode", std::string(bilinear ? "bilinear" : "nearest")}};
  size_t sf = bilinear ? 3 : 2;  // first scale argument
  if (bilinear) a["align_corners"] = int64_t{bool_arg(c, 2, "align_corners")};
  std::vector<double> scales;
  const size_t nargs = c.in.size();
  if (nargs == sf + 1) {  // vector overload
    if (!c.in[sf].is_none()) scales = floats_arg(c, sf, "scale_factors");
  } else if (nargs == sf + 2) {
    if (!c.in[sf].is_none() && !c.in[sf + 1].is_none()) scales = {float_arg(c, sf, "scales_h"), float_arg(c, sf + 1, "scales_w")};
  } else {
    fail(c, k + ": unexpected number of arguments");
  }
  if (!scales.empty()) {
    a["scale_factor"] = scales;
  } else {
    if (c.in[1].is_none()) fail(c, k + " without output_size or scale factors");
    a["size"] = ints_arg(c, 1, "output_size");
  }
  return {tensor_val(emit(c, "upsample", {x}, a)[0])};
}

// ---------------------------------------------------------------------------- post-processing

void Importer::fuse_channel_shuffles(const std::vector<std::string>& outputs) {
  // Uses of each value among live pending nodes and graph outputs.
  std::map<std::string, int> uses;
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].removed) continue;
    for (const auto& v : pending_[i].node.inputs) ++uses[v];
    for (const auto& v : pending_[i].node.outputs) producer[v] = i;
  }
  for (const auto& v : outputs) uses[v] += 2;
  auto single_user = [&](const std::string& v) { return uses[v] == 1; };
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& r2 = pending_[i];
    if (r2.removed || r2.node.op != "reshape") continue;
    auto pt = producer.find(r2.node.inputs[0]);
    if (pt == producer.end()) continue;
    Pending& t = pending_[pt->second];
    if (t.node.op != "transpose" || !single_user(t.node.outputs[0])) continue;
    std::set<int64_t> td{t.node.attr_int("dim0"), t.node.attr_int("dim1")};
    if (td != std::set<int64_t>{1, 2}) continue;
    auto pr = producer.find(t.node.inputs[0]);
    if (pr == producer.end()) continue;
    Pending& r1 = pending_[pr->second];
    if (r1.node.op != "reshape" || !single_user(r1.node.outputs[0])) continue;
    const Shape& in = scratch_.value(r1.node.inputs[0]).shape;
    const Shape& mid = scratch_.value(r1.node.outputs[0]).shape;
    const Shape& out = scratch_.value(r2.node.outputs[0]).shape;
    if (in.size() < 2 || mid.size() != in.size() + 1 || out != in) continue;
    const int64_t g = mid[1];
    if (g < 1 || mid[2] * g != in[1] || !std::equal(in.begin() + 2, in.end(), mid.begin() + 3)) continue;
    Node cs;
    cs.name = r2.node.name;
    cs.op = "channel_shuffle";
    cs.inputs = {r1.node.inputs[0]};
    cs.outputs = r2.node.outputs;
    cs.attrs = {{"groups", g}};
    r2.node = cs;
    r2.frame = r1.frame;
    r1.removed = t.removed = true;
  }
}

void Importer::remove_dead(const std::vector<std::string>& outputs) {
  std::set<std::string> used(outputs.begin(), outputs.end());
  for (size_t i = pending_.size(); i-- > 0;) {
    Pending& p = pending_[i];
    if (p.removed) continue;
    bool live = false;
    for (const auto& o : p.node.outputs) live = live || used.count(o);
    if (!live) {
      p.removed = true;
      continue;
    }
    used.insert(p.node.inputs.begin(), p.node.inputs.end());
  }
}

Graph Importer::build(const std::vector<std::string>& outputs) {
  // Frame statistics: nodes directly in each frame, and whether a strictly nested frame has nodes.
  std::vector<int> count(frames_.size(), 0);
  std::vector<bool> nested(frames_.size(), false);
  for (const auto& p : pending_) {
    if (p.removed) continue;
    ++count[static_cast<size_t>(p.frame)];
    for (int f = frames_[static_cast<size_t>(p.frame)].parent; f >= 0; f = frames_[static_cast<size_t>(f)].parent)
      nested[static_cast<size_t>(f)] = true;
  }
  std::set<std::string> taken;
  for (const auto& p : pending_)
    if (!p.removed) taken.insert(p.fixed_name);
  // The graph input keeps the forward's argument name when it is free.
  std::string input_name = "input";
  if (auto g = module_.get_method("forward").graph(); g->inputs().size() > 1) {
    std::string dn = g->inputs()[1]->debugName();
    dn = dn.substr(0, dn.find('.'));
    if (!dn.empty() && !std::isdigit(static_cast<unsigned char>(dn[0]))) input_name = dn;
  }
  for (int i = 1; taken.count(input_name); ++i) input_name = "input_" + std::to_string(i);
  taken.insert(input_name);

  std::map<std::string, std::string> rename{{scratch_input_, input_name}};
  Graph g;
  g.add_input(input_name, shape_);
  for (auto& p : pending_) {
    if (p.removed) continue;
    std::string name = p.fixed_name;
    if (name.empty()) {
      const Frame& f = frames_[static_cast<size_t>(p.frame)];
      const size_t fi = static_cast<size_t>(p.frame);
      std::string base = (!f.path.empty() && count[fi] == 1 && !nested[fi]) ? f.path : join_path(f.path, p.node.op);
      name = base;
      for (int i = 1; taken.count(name); ++i) name = base + "_" + std::to_string(i);
      taken.insert(name);
    }
    Node node = p.node;
    node.name = name;
    node.outputs.clear();
    for (auto& in : node.inputs) in = rename.at(in);
    try {
      g.add_node(node, p.num_outputs);
    } catch (const Error& e) {
      throw Error("import_torchscript(" + label_ + "): internal: rebuilding node '" + name + "' failed: " + e.what());
    }
    const auto& outs = g.node(name).outputs;
    for (size_t i = 0; i < outs.size(); ++i) rename[p.node.outputs[i]] = outs[i];
  }
  std::vector<std::string> outs;
  for (const auto& o : outputs) outs.push_back(rename.at(o));
  g.set_outputs(outs);
  return g;
}

Graph Importer::run() {
  scratch_.add_input(scratch_input_, shape_);
  Frame top;
  if (auto qn = module_.type()->name()) top.type_name = qn->name();
  frames_.push_back(top);

  jit::Method forward = [&] {
    try {
      return module_.get_method("forward");
    } catch (const std::exception&) {
      throw Error("import_torchscript(" + label_ + "): the module has no forward method");
    }
  }();
  std::shared_ptr<jit::Graph> graph = forward.graph();
  if (graph->inputs().size() != 2)
    throw Error("import_torchscript(" + label_ + "): forward takes " + std::to_string(graph->inputs().size() - 1) +
                " arguments; whittle imports modules with one tensor input");
  AVal self = const_val(module_._ivalue());
  std::vector<AVal> out = call_graph(graph, {self, tensor_val(scratch_input_)}, 0);

  std::vector<std::string> outputs;
  std::function<void(const AVal&)> collect = [&](const AVal& a) {
    if (a.is_tensor()) {
      outputs.push_back(resolve(a.tensor));
    } else if (a.items && !a.items->empty()) {
      for (const auto& i : *a.items) collect(i);
    } else {
      throw Error("import_torchscript(" + label_ +
                  "): forward returns a value that is not a computed tensor (a constant, parameter or empty list); "
                  "whittle graphs return tensors computed from the input");
    }
  };
  for (const auto& a : out) collect(a);
  for (const auto& o : outputs)
    if (o == scratch_input_)
      throw Error("import_torchscript(" + label_ + "): forward returns its input unchanged; nothing to import");

  if (options_.fuse_channel_shuffle) fuse_channel_shuffles(outputs);
  remove_dead(outputs);

  // Every parameter and buffer must have landed in a node (or be explicitly allowed to stay out).
  std::set<std::string> imported;
  for (const auto& p : pending_) {
    if (p.removed) continue;
    for (const auto& kv : p.node.params) imported.insert(join_path(p.fixed_name, kv.first));
    for (const auto& kv : p.node.buffers) imported.insert(join_path(p.fixed_name, kv.first));
  }
  std::vector<std::string> unused;
  for (const auto& p : module_.named_parameters(true))
    if (!imported.count(p.name)) unused.push_back(p.name);
  for (const auto& b : module_.named_buffers(true))
    if (!imported.count(b.name)) unused.push_back(b.name);
  if (!unused.empty() && !options_.allow_unused_tensors) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 10; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 10) list += ", ... (" + std::to_string(unused.size()) + " in all)";
    throw Error("import_torchscript(" + label_ + "): " + std::to_string(unused.size()) +
                " parameters/buffers are not used by any imported op: " + list +
                " (set TorchScriptImportOptions::allow_unused_tensors to skip them)");
  }
  return build(outputs);
}

}  // namespace

Graph import_torchscript(const torch::jit::Module& module, const Shape& example_input_shape,
                         const TorchScriptImportOptions& options, const std::string& label) {
  if (example_input_shape.empty())
    throw Error("import_torchscript(" + label + "): the example input shape must include the batch dimension");
  for (int64_t d : example_input_shape)
    if (d < 1) throw Error("import_torchscript(" + label + "): bad example input shape " + shape_str(example_input_shape));
  at::NoGradGuard no_grad;
  Importer importer(module, example_input_shape, options, label);
  Graph g = importer.run();
  return g;
}

Graph import_torchscript(const std::string& path, const Shape& example_input_shape, const TorchScriptImportOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error("import_torchscript(" + path + "): no such file");
  if (std::filesystem::is_directory(path, ec)) throw Error("import_torchscript(" + path + "): is a directory, not a file");
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw Error("import_torchscript(" + path + "): not a readable TorchScript archive (" +
                first_line(e.what_without_backtrace()) + ")");
  } catch (const std::exception& e) {
    throw Error("import_torchscript(" + path + "): not a readable TorchScript archive (" + first_line(e.what()) + ")");
  }
  return import_torchscript(module, example_input_shape, options, path);
}

}  // namespace whittle
