#include "runner/recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/shape_limits.h"
#include "core/file_util.h"
#include "graph/select.h"
#include "graph/zoo.h"
#include "data/loader.h"
#include "export/exporter.h"
#include "runner/modifier.h"
#include "runner/run_files.h"

namespace whittle::runner {

namespace {

[[noreturn]] void usage_error(const std::string& msg) { throw Error(msg, ErrorKind::kUsage); }


// Validates `node` against `keys`, throwing whittle::Error (usage) naming `origin`, the line and
// the dotted key path `where` on the first problem. Used for recipe sections and modifier settings.
void validate_keys(const YAML::Node& node, const std::vector<KeySpec>& keys, const std::string& origin,
                   const std::string& where, const std::string& label = "");

// Nodes that came from --set overrides (and everything inside them), so that messages about them
// say "--set" rather than a line of the file. Filled by parse_recipe for the duration of a parse.
thread_local std::vector<YAML::Node>* t_override_nodes = nullptr;

void collect_nodes(const YAML::Node& n, std::vector<YAML::Node>& out) {
  out.push_back(n);
  if (n.IsSequence()) {
    for (const auto& e : n) collect_nodes(e, out);
  } else if (n.IsMap()) {
    for (const auto& kv : n) {
      collect_nodes(kv.first, out);
      collect_nodes(kv.second, out);
    }
  }
}

std::string at_line(const std::string& origin, const YAML::Node& node) {
  if (t_override_nodes)
    for (const auto& o : *t_override_nodes)
      if (o.is(node)) return origin + " (--set)";
  const YAML::Mark m = node.Mark();
  if (m.is_null() || m.line < 0) return origin + " (--set)";
  return origin + ":" + std::to_string(m.line + 1);
}

// A string value (or list element) against the key's choices, if it has any.
void check_choice(const YAML::Node& v, const KeySpec& spec, const std::string& origin, const std::string& path) {
  if (spec.choices.empty() || std::find(spec.choices.begin(), spec.choices.end(), v.Scalar()) != spec.choices.end()) return;
  std::string hint = closest_match(v.Scalar(), spec.choices);
  std::string all;
  for (const auto& c : spec.choices) all += (all.empty() ? "" : ", ") + c;
  usage_error(at_line(origin, v) + ": '" + path + "' is '" + v.Scalar() + "'" +
              (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (one of: " + all + ")");
}

KeySpec section(std::string name, std::string desc, std::vector<KeySpec> children) {
  return KeySpec{std::move(name), KeyType::kMap, "", std::move(desc), std::move(children), {}, {}};
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool scalar_is(const YAML::Node& n, KeyType t) {
  if (!n.IsScalar()) return false;
  const std::string s = n.Scalar();
  try {
    switch (t) {
      case KeyType::kString: return true;
      case KeyType::kInt: {
        // As the typed getters read it (yaml-cpp: "09" is not an integer, a bad octal), and all of it.
        size_t used = 0;
        (void)std::stoll(s, &used);
        (void)n.as<int64_t>();
        return used == s.size();
      }
      case KeyType::kFloat: {
        (void)n.as<double>();
        return true;
      }
      case KeyType::kBool: {
        (void)n.as<bool>();
        return true;
      }
      default: return false;
    }
  } catch (const std::exception&) {
    return false;
  }
}

KeyType element_type(KeyType list) {
  switch (list) {
    case KeyType::kFloatList: return KeyType::kFloat;
    case KeyType::kIntList: return KeyType::kInt;
    default: return KeyType::kString;
  }
}

std::string names_of(const std::vector<KeySpec>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k.name;
  return s;
}

// ---- the sections' keys, bound to the fields of their structs (the initializers are the defaults)

// `keys` with the printed default of `name` replaced by `text`: for a default computed from other
// values ("required", "runs/<recipe name>"), which no initializer can show.
std::vector<KeySpec> shown(std::vector<KeySpec> keys, const std::map<std::string, std::string>& text) {
  for (KeySpec& k : keys)
    if (auto it = text.find(k.name); it != text.end()) k.default_text = it->second;
  return keys;
}

const OptionsSchema<ModelSpec>& model_schema() {
  using M = ModelSpec;
  static const auto schema = [] {
    std::string zoo_list;
    for (const std::string& m : zoo_models()) zoo_list += (zoo_list.empty() ? "" : ", ") + m;
    return OptionsSchema<M>()
        .add("name", &M::name, "zoo model: " + zoo_list)
        .add("file", &M::file,
             "instead of `name`: a TorchScript .pt file or a whittle checkpoint .h5 (`--set model.file=F` replaces the "
             "recipe's `name` and `weight_init`)")
        .add("num_classes", &M::num_classes,
             "classifier outputs of a zoo model; beside `file`, the outputs its model must have")
        .in_range(Range::at_least(1))
        .add("weight_init", &M::weight_init,
             "how a zoo model's conv weights are drawn: torch (torch.nn's default, U(±1/√fan_in)) or kaiming_normal (He "
             "et al. 2015, N(0, 2/fan_in), as the ResNet papers)",
             weight_init_names())
        .add("input_shape", &M::input_shape, "example input shape declared on the graph")
        .in_range(Range::at_least(1));
  }();
  return schema;
}

const OptionsSchema<DataSpec>& data_schema() {
  using D = DataSpec;
  static const auto schema =
      OptionsSchema<D>()
          .add("train", &D::train,
               "training set: MNIST IDX folder or file, CIFAR-10 binary folder, image folder, .tar.gz of image folders, "
               "or .h5")
          .add("test", &D::test, "evaluation set, same kinds")
          .add("train_split", &D::train_split,
               "split read from `train` when it holds several (MNIST: train/t10k, CIFAR: train/test)")
          .add("test_split", &D::test_split, "split read from `test`")
          .add("pack_to", &D::pack_to, "folder for packed HDF5 copies of image-folder datasets, made on first use")
          .add("mean", &D::mean, "per-channel normalization mean, pixel values in [0, 1]", {}, "none")
          .in_range(Range::closed(0, 1))
          .add("std", &D::std, "per-channel normalization standard deviation", {}, "none")
          .in_range(Range::above(0))
          .add("random_crop_padding", &D::random_crop_padding,
               "training augmentation: pad by N zero pixels, crop back at a random offset")
          .in_range(Range::closed(0, 1024))
          .add("horizontal_flip", &D::horizontal_flip, "training augmentation: random left-right flip")
          .add("batch_size", &D::batch_size, "training batch size")
          .in_range(Range::at_least(1))
          .add("eval_batch_size", &D::eval_batch_size, "evaluation batch size")
          .in_range(Range::at_least(1))
          .add("num_workers", &D::num_workers, "loader threads")
          .in_range(Range::closed(0, data::kMaxWorkers))
          .add("prefetch", &D::prefetch, "batches prepared ahead of training")
          .in_range(Range::closed(1, data::kMaxPrefetchBatches))
          .add("drop_last", &D::drop_last, "drop the last incomplete training batch")
          .add("train_limit", &D::train_limit,
               "use only N training images: in rounds, the next image of each class in dataset order (every class, "
               "even in a class-sorted folder)",
               {}, "all")
          .in_range(Range::at_least(0))
          .add("test_limit", &D::test_limit, "use only N test images, chosen as train_limit chooses", {}, "all")
          .in_range(Range::at_least(0));
  return schema;
}

const OptionsSchema<OptimizerSpec>& optimizer_schema() {
  using O = OptimizerSpec;
  static const auto schema =
      OptionsSchema<O>()
          .add("name", &O::name, "sgd, adam or adamw", {"sgd", "adam", "adamw"})
          .add("lr", &O::lr, "base learning rate")
          .in_range(Range{0, 1e6, true, false})
          .add("momentum", &O::momentum, "SGD momentum")
          .in_range(Range::half_open(0, 1))
          .add("nesterov", &O::nesterov, "SGD Nesterov momentum")
          .add("weight_decay", &O::weight_decay, "L2 penalty (sgd, adam) or decoupled decay (adamw)")
          .in_range(Range::closed(0, 1e3))
          .add("norm_weight_decay", &O::norm_weight_decay,
               "weight decay of normalization layers' γ and β (batch_norm weight and bias); 0 exempts them", {},
               "= weight_decay")
          .in_range(Range::closed(0, 1e3))
          .add("bias_weight_decay", &O::bias_weight_decay, "weight decay of the other biases (conv, linear); 0 exempts them",
               {}, "= weight_decay")
          .in_range(Range::closed(0, 1e3))
          .add("beta1", &O::beta1, "Adam β1")
          .in_range(Range::half_open(0, 1))
          .add("beta2", &O::beta2, "Adam β2")
          .in_range(Range::half_open(0, 1))
          .add("eps", &O::eps, "Adam ε")
          .in_range(Range::above(0))
          .add("fused", &O::fused, "sgd: ATen's fused SGD kernel, one pass a parameter (same rule, equal up to float rounding)");
  return schema;
}

const OptionsSchema<ScheduleSpec>& schedule_schema() {
  using S = ScheduleSpec;
  static const auto schema =
      OptionsSchema<S>()
          .add("name", &S::name, "constant, step, multistep, cosine, linear or one_cycle",
               {"constant", "step", "multistep", "cosine", "linear", "one_cycle"})
          .add("step_size", &S::step_size, "step: epochs between decays")
          .in_range(Range::above(0))
          .add("milestones", &S::milestones, "multistep: epochs where lr is multiplied by gamma")
          .in_range(Range::at_least(0))
          .add("gamma", &S::gamma, "step/multistep decay factor")
          .in_range(Range::above(0))
          .add("min_lr", &S::min_lr, "cosine, linear: final learning rate (at most optimizer.lr)")
          .in_range(Range::closed(0, 1e6))
          .add("max_lr", &S::max_lr, "one_cycle: peak learning rate", {}, "= optimizer.lr")
          .in_range(Range::closed(0, 1e6))
          .add("pct_start", &S::pct_start, "one_cycle: fraction of the steps spent rising")
          .in_range(Range{0, 1, true, true})
          .add("warmup_epochs", &S::warmup_epochs, "linear warmup from 0 over this many epochs")
          .in_range(Range::at_least(0));
  return schema;
}

// training's own keys (its optimizer and lr_schedule sections have theirs).
const OptionsSchema<TrainingSpec>& training_schema() {
  using T = TrainingSpec;
  static const auto schema =
      OptionsSchema<T>()
          .add("epochs", &T::epochs, "number of epochs (0: calibration only: the modifiers apply, no optimizer step)")
          .in_range(Range::closed(0, 1000000))
          .add("label_smoothing", &T::label_smoothing, "cross-entropy label smoothing")
          .in_range(Range::half_open(0, 1))
          .add("grad_accumulation", &T::grad_accumulation, "optimizer step every N batches")
          .in_range(Range::at_least(1))
          .add("grad_clip_norm", &T::grad_clip_norm, "clip the global gradient L2 norm", {}, "off")
          .in_range(Range::at_least(0))
          .add("seed", &T::seed, "seed for initialization, shuffling and augmentation")
          .in_range(Range::at_least(0))
          .add("deterministic", &T::deterministic, "deterministic kernels; same seed, same run")
          .add("device", &T::device, "cpu, cuda or cuda:N (the command line's --device overrides it)")
          .add("amp", &T::amp, "CUDA autocast: none, bf16 or fp16 (with loss scaling)", {"none", "bf16", "fp16"})
          .add("channels_last", &T::channels_last, "CUDA: NHWC memory format")
          .add("cudnn_benchmark", &T::cudnn_benchmark, "CUDA: cuDNN autotuning (off in deterministic mode)")
          .add("threads", &T::threads, "intra-op CPU threads", {}, "LibTorch default")
          .in_range(Range::closed(0, 1024))
          .add("log_every", &T::log_every, "batches between progress lines when output is not a terminal")
          .in_range(Range::at_least(1))
          .add("activation_checkpointing", &T::activation_checkpointing,
               "node-name prefixes of segments (e.g. layer1 for a ResNet stage, layer2.0 for a block) whose activations "
               "are recomputed in the backward pass instead of kept: less memory, one more forward of them "
               "(docs/performance.md)");
  return schema;
}

const OptionsSchema<DistributedSpec>& distributed_schema() {
  using D = DistributedSpec;
  static const auto schema =
      OptionsSchema<D>()
          .add("backend", &D::backend, "c10d backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl", {"auto", "gloo", "nccl"})
          .add("timeout_seconds", &D::timeout_seconds, "a collective waiting longer fails the run (a rank hung or died)")
          .in_range(Range::above(0))
          .add("bucket_cap_mb", &D::bucket_cap_mb, "gradient all-reduce bucket size, MiB")
          .in_range(Range::above(0))
          .add("find_unused_parameters", &D::find_unused_parameters, "allow trainable parameters that get no gradient in a step")
          .add("broadcast_buffers", &D::broadcast_buffers, "rank 0's buffers (BN running statistics) to every rank before each forward")
          .add("sync_batchnorm", &D::sync_batchnorm,
               "training batch norms normalize with the statistics of all ranks' batches (as torch.nn.SyncBatchNorm)")
          .add("verify_every", &D::verify_every, "every N optimizer steps check that all ranks hold bitwise-equal parameters",
               {}, "off")
          .in_range(Range::at_least(0));
  return schema;
}

// outputs' own keys (each exporter's options join them as <format>_<option>).
const OptionsSchema<OutputsSpec>& outputs_schema() {
  using O = OutputsSpec;
  static const auto schema =
      OptionsSchema<O>()
          .add("dir", &O::dir, "run directory (the command line's --out overrides it)")
          .add("checkpoint", &O::checkpoint, "checkpoint file name inside the run directory")
          .add("save_every_epoch", &O::save_every_epoch, "write checkpoint and training state after every epoch")
          .add("export", &O::export_formats,
               "also write the final model in these formats beside the checkpoint (onnx: model.onnx, torchscript: "
               "model.pt; docs/export.md)");
  return schema;
}

// The keys every modifier entry has (its own settings follow them).
const OptionsSchema<ModifierSpec>& modifier_schema() {
  using M = ModifierSpec;
  static const auto schema = OptionsSchema<M>()
                                 .add("name", &M::name, "the modifier")
                                 .add("start_epoch", &M::start_epoch, "epoch (fractional) at which it becomes active")
                                 .in_range(Range::at_least(0))
                                 .add("end_epoch", &M::end_epoch, "epoch at which it stops", {}, "to the end")
                                 .in_range(Range::at_least(-1))
                                 .add("targets", &M::targets, "node names, op kinds or re:<regex>")
                                 .add("ignore", &M::ignore, "node names, op kinds or re:<regex> to leave alone");
  return schema;
}

SettingValue setting_value(const YAML::Node& v, const KeySpec& spec);

// Sets the fields of `out` from the keys of the validated section `n` that `schema` binds (a
// sub-section or a key another reader owns is skipped; an empty value keeps the default).
template <class T>
void read_section(const YAML::Node& n, const OptionsSchema<T>& schema, T& out, const std::string& where) {
  if (!n || !n.IsMap()) return;
  Settings given;
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    if (!schema.has(key) || !kv.second || kv.second.IsNull()) continue;
    const KeySpec& spec = *std::find_if(schema.keys().begin(), schema.keys().end(), [&](const KeySpec& k) { return k.name == key; });
    given[key] = setting_value(kv.second, spec);
  }
  schema.parse_into(out, given, OptionSource{where});
}

std::vector<KeySpec> build_schema() {
  std::vector<KeySpec> s;
  s.push_back(section("model", "The network to train (required section).",
                      shown(model_schema().keys(), {{"name", "—"}, {"file", "—"}, {"input_shape", "[1, C, H, W] of the data"}})));
  s.push_back(section("data", "Datasets, preprocessing and loading (required section).",
                      shown(data_schema().keys(), {{"train", "required"}, {"test", "required"}, {"pack_to", "none"}})));
  std::vector<KeySpec> training = training_schema().keys();
  training.insert(training.begin() + 1, {section("optimizer", "Optimizer and its hyper-parameters.", optimizer_schema().keys()),
                                         section("lr_schedule", "Learning-rate schedule, evaluated every step.",
                                                 schedule_schema().keys())});
  s.push_back(section("training", "The optimization schedule (required section; `training: {}` takes every default).",
                      std::move(training)));
  s.push_back(KeySpec{"modifiers", KeyType::kList, "[]",
                      "Compression modifiers, each a map with `name`, `start_epoch`, `end_epoch`, `targets`, "
                      "`ignore` and the modifier's own settings (see below).",
                      {}, {}, {}});
  std::vector<KeySpec> outputs = shown(outputs_schema().keys(), {{"dir", "runs/<recipe name>"}});
  for (KeySpec& k : outputs)
    if (k.name == "export") k.choices = exporters().names();
  // Each exporter's options, as outputs.<format>_<option> (outputs.onnx_opset).
  for (const auto& format : exporters().names())
    for (KeySpec k : exporter(format).option_keys()) {
      k.name = format + "_" + k.name;
      k.description = format + " export: " + k.description;
      outputs.push_back(std::move(k));
    }
  s.push_back(section("outputs", "Where results go.", std::move(outputs)));
  s.push_back(section("distributed",
                      "Data-parallel training when a launcher (torchrun, a SLURM script) sets WORLD_SIZE, RANK and "
                      "MASTER_ADDR/MASTER_PORT; ignored by a single process (docs/distributed.md).",
                      distributed_schema().keys()));
  return s;
}

std::vector<KeySpec> modifier_common_keys() {
  return shown(modifier_schema().keys(), {{"name", "required"}, {"targets", "the modifier's default"}});
}

// ---- typed getters (after validation) ----
template <typename T>
void get(const YAML::Node& parent, const char* name, T& out) {
  const YAML::Node n = parent[name];
  if (!n || n.IsNull()) return;
  try {
    out = n.as<T>();
  } catch (const YAML::Exception&) {
    // The schema check before accepts only convertible values; a value it let through that the
    // conversion still refuses (an integer too large for its field) is named here.
    usage_error("line " + std::to_string(n.Mark().line + 1) + ": '" + name + "' cannot be read as the type it needs" +
                (n.IsScalar() ? ": '" + n.Scalar() + "'" : std::string()));
  }
}

// How many places of the tree under `root` hold `target`: a YAML alias (`std: *m`) holds its
// anchor's node (`mean: &m [0.5]`) once more. Each node's children are visited once.
int holders(const YAML::Node& root, const YAML::Node& target) {
  int count = 0;
  std::vector<YAML::Node> seen;
  std::function<void(const YAML::Node&)> visit = [&](const YAML::Node& n) {
    if (n.is(target)) ++count;
    for (const auto& s : seen)
      if (s.is(n)) return;
    seen.push_back(n);
    if (n.IsMap())
      for (auto it = n.begin(); it != n.end(); ++it) visit(it->second);
    else if (n.IsSequence())
      for (auto it = n.begin(); it != n.end(); ++it) visit(*it);
  };
  visit(root);
  return count;
}

// Makes entry `key` of map `parent` (or entry `index` of a sequence) hold `fresh` instead of the
// node it shares with an alias. Assigning to that node (`parent[key] = v`) would change every alias
// of it; the container is rebuilt instead, in its order, its other aliased entries copied (a
// rebuilt container's entries share their data with the nodes they were built from).
void rebind(const YAML::Node& root, YAML::Node parent, const std::string& key, size_t index, const YAML::Node& fresh) {
  YAML::Node rebuilt(parent.IsMap() ? YAML::NodeType::Map : YAML::NodeType::Sequence);
  auto own = [&](const YAML::Node& n) { return holders(root, n) > 1 ? YAML::Clone(n) : n; };
  size_t i = 0;
  for (auto it = parent.begin(); it != parent.end(); ++it, ++i) {
    if (parent.IsMap())
      rebuilt[it->first] = it->first.IsScalar() && it->first.Scalar() == key ? fresh : own(it->second);
    else
      rebuilt.push_back(i == index ? fresh : own(*it));
  }
  parent = rebuilt;
}

void set_override(YAML::Node root, const std::string& assignment, const std::string& origin,
                  std::vector<YAML::Node>& created) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    usage_error("--set '" + assignment + "': expected path.to.key=value");
  const std::string path = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    usage_error("--set '" + assignment + "': value is not valid YAML (" + e.msg + ")");
  }
  // An empty value would quietly clear a whole section or list (--set modifiers= trains without
  // them); clearing is said with [] or {}.
  if (value.IsNull())
    usage_error("--set '" + assignment + "': no value for '" + path +
                "' (an empty list is [], an empty section {})");
  collect_nodes(value, created);
  if (path.front() == '.' || path.back() == '.')
    usage_error("--set '" + assignment + "': empty component in '" + path + "'");
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (part.empty()) usage_error("--set '" + assignment + "': empty component in '" + path + "'");
    parts.push_back(part);
  }
  // Walk down, creating maps where missing; sequences are indexed by number.
  std::function<void(YAML::Node, size_t)> walk = [&](YAML::Node node, size_t i) {
    const std::string& k = parts[i];
    const bool last = i + 1 == parts.size();
    if (node.IsSequence()) {
      size_t idx = 0;
      try {
        size_t used = 0;
        idx = std::stoul(k, &used);
        if (used != k.size()) throw std::invalid_argument(k);
      } catch (const std::exception&) {
        usage_error("--set '" + assignment + "': '" + k + "' must be a list index (0.." + std::to_string(node.size()) + ")");
      }
      // Index size() appends an entry (modifiers.2={name: fuse_batchnorm} after two modifiers).
      if (idx > node.size() || (idx == node.size() && !last)) {
        std::string entry;
        for (size_t j = 0; j <= i; ++j) entry += (j ? "." : "") + parts[j];
        usage_error("--set '" + assignment + "': index " + k + " is past the end of a list of " + std::to_string(node.size()) +
                    (idx == node.size() ? " (a whole new entry can be appended: --set " + entry + "={name: ...})"
                                        : " (the next entry to append is " + std::to_string(node.size()) + ")"));
      }
      if (idx == node.size()) {
        node.push_back(value);
      } else if (holders(root, node[idx]) > 1) {  // an alias's node: this path gets its own
        rebind(root, node, "", idx, last ? value : YAML::Clone(node[idx]));
        if (!last) walk(node[idx], i + 1);
      } else if (last) {
        node[idx] = value;
      } else {
        walk(node[idx], i + 1);
      }
      return;
    }
    if (!node.IsMap() && !node.IsNull())
      usage_error("--set '" + assignment + "': '" + parts[i - 1] + "' in " + origin + " is a value, not a section");
    if (node.IsMap() && node[k] && holders(root, node[k]) > 1) {  // an alias's node: this path gets its own
      rebind(root, node, k, 0, last ? value : YAML::Clone(node[k]));
      if (!last) walk(node[k], i + 1);
      return;
    }
    if (last) {
      node[k] = value;
      return;
    }
    if (!node[k] || node[k].IsNull()) {
      const std::string& next = parts[i + 1];
      if (next == "0" && i + 2 == parts.size()) {
        node[k] = YAML::Node(YAML::NodeType::Sequence);  // a list's first entry: the list is new
      } else if (next.find_first_not_of("0123456789") == std::string::npos) {
        std::string here;
        for (size_t j = 0; j <= i; ++j) here += (j ? "." : "") + parts[j];
        usage_error("--set '" + assignment + "': " + origin + " has no list '" + here + "', so no entry " + next);
      } else {
        node[k] = YAML::Node(YAML::NodeType::Map);
      }
    }
    walk(node[k], i + 1);
  };
  walk(root, 0);
}

}  // namespace

const std::vector<KeySpec>& recipe_schema() {
  static const std::vector<KeySpec> schema = build_schema();
  return schema;
}

bool is_device_name(const std::string& device) {
  if (device == "cpu" || device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8) return false;
  return device.find_first_not_of("0123456789", 5) == std::string::npos;
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close: at most a third of the word's letters differ (at least one edit allowed), or a prefix.
  if (best_d <= std::max<size_t>(2, word.size() / 3)) return best;
  for (const auto& c : candidates)
    if (!word.empty() && (c.rfind(word, 0) == 0 || word.rfind(c, 0) == 0)) return c;
  return "";
}

namespace {

// A flow list of the key's kind, for messages: its first choice, names, or numbers.
std::string list_example(const KeySpec& spec) {
  if (spec.type != KeyType::kStringList) return "[1, 2]";
  if (!spec.choices.empty()) return "[" + spec.choices.front() + "]";
  return "[conv1, layer2]";
}

// What a YAML node is, for messages: "'4'", "an empty value", "a section", "a list".
std::string node_kind(const YAML::Node& v) {
  if (!v || v.IsNull()) return "an empty value";
  if (v.IsScalar()) return "'" + v.Scalar() + "'";
  return v.IsMap() ? "a section" : "a list";
}

// Checks the numeric scalar `v` (already known to parse as `spec.type`'s number type) against
// spec.range: finite, and inside the interval.
void check_range(const YAML::Node& v, const KeySpec& spec, const std::string& origin, const std::string& path) {
  const double x = v.as<double>();
  if (!std::isfinite(x))
    usage_error(at_line(origin, v) + ": '" + path + "' is " + v.Scalar() + "; recipe numbers must be finite");
  if (!spec.range.contains(x))
    usage_error(at_line(origin, v) + ": '" + path + "' is " + v.Scalar() + "; it must be " +
                (std::isfinite(spec.range.lo) && std::isfinite(spec.range.hi) ? "in " : "") + spec.range.text());
}

void validate_keys(const YAML::Node& node, const std::vector<KeySpec>& keys, const std::string& origin,
                   const std::string& where, const std::string& given_label) {
  const std::string label = !given_label.empty() ? given_label : where.empty() ? "the top level" : "'" + where + "'";
  if (!node.IsMap()) usage_error(at_line(origin, node) + ": " + label + " must be a section (key: value pairs)");
  std::vector<std::string> names;
  for (const auto& k : keys) names.push_back(k.name);
  std::map<std::string, YAML::Node> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) usage_error(at_line(origin, kv.first) + ": a key in " + label + " must be a plain name");
    const std::string name = kv.first.as<std::string>();
    const std::string path = where.empty() ? name : where + "." + name;
    // yaml-cpp keeps every copy of a repeated key and lookups return the first: a duplicate would
    // silently lose the later value.
    if (auto dup = seen.find(name); dup != seen.end())
      usage_error(at_line(origin, kv.first) + ": key '" + path + "' is given twice (also at " +
                  at_line(origin, dup->second) + ")");
    seen.emplace(name, kv.first);
    auto spec = std::find_if(keys.begin(), keys.end(), [&](const KeySpec& k) { return k.name == name; });
    if (spec == keys.end()) {
      std::string hint = closest_match(name, names);
      usage_error(at_line(origin, kv.first) + ": unknown key '" + path + "'" +
                  (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (valid keys in " + label + ": " +
                  names_of(keys) + ")");
    }
    const YAML::Node& v = kv.second;
    const std::string wrong = at_line(origin, v) + ": '" + path + "' must be " + std::string(spec->type == KeyType::kInt ? "an " : "a ") + key_type_name(spec->type);
    switch (spec->type) {
      case KeyType::kMap:
        if (v.IsNull()) break;
        validate_keys(v, spec->children, origin, path);
        break;
      case KeyType::kList:
        if (!v.IsNull() && !v.IsSequence()) usage_error(wrong);
        break;
      case KeyType::kFloatList:
      case KeyType::kIntList:
      case KeyType::kStringList: {
        if (v.IsScalar() && spec->type == KeyType::kStringList) {  // one string stands for a list of one
          check_choice(v, *spec, origin, path);
          break;
        }
        if (!v.IsSequence())
          usage_error(wrong + ", e.g. " + list_example(*spec));
        for (const auto& e : v) {
          if (!scalar_is(e, element_type(spec->type))) usage_error(wrong + "; element " + node_kind(e) + " is not");
          if (spec->type != KeyType::kStringList) check_range(e, *spec, origin, path);
          else check_choice(e, *spec, origin, path);
        }
        break;
      }
      case KeyType::kAny: break;
      default:
        if (!scalar_is(v, spec->type)) usage_error(wrong + ", got " + node_kind(v));
        if (spec->type == KeyType::kInt || spec->type == KeyType::kFloat) check_range(v, *spec, origin, path);
        check_choice(v, *spec, origin, path);
    }
  }
}

// The typed value of a modifier setting `v` (validated against `spec`).
SettingValue setting_value(const YAML::Node& v, const KeySpec& spec) {
  switch (spec.type) {
    case KeyType::kBool: return v.as<bool>();
    case KeyType::kInt: return v.as<int64_t>();
    case KeyType::kFloat: return v.as<double>();
    case KeyType::kString: return v.Scalar();
    case KeyType::kFloatList: return v.as<std::vector<double>>();
    case KeyType::kIntList: return v.as<std::vector<int64_t>>();
    case KeyType::kStringList:
      if (v.IsScalar()) return std::vector<std::string>{v.Scalar()};
      return v.as<std::vector<std::string>>();
    default: {
      YAML::Emitter out;
      out << YAML::Flow << v;
      return std::string(out.c_str());
    }
  }
}

// Reads the validated `data:` section `d` into `out` (no checks of the files).
void read_data_section(const YAML::Node& d, DataSpec& out) { read_section(d, data_schema(), out, "data"); }

YAML::Node load_yaml(const std::string& text, const std::string& origin) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    usage_error(origin + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  // A second document would be dropped unread: a recipe is one document (an empty one after a
  // trailing '---' says nothing).
  for (size_t k = 1; k < docs.size(); ++k)
    if (docs[k] && !docs[k].IsNull())
      usage_error(origin + ":" + std::to_string(docs[k].Mark().line + 1) +
                  ": a second YAML document (after a '---' line); a recipe is one document");
  return docs.empty() ? YAML::Node() : docs.front();
}

const KeySpec& section_spec(const char* name) {
  const auto& schema = recipe_schema();
  return *std::find_if(schema.begin(), schema.end(), [&](const KeySpec& k) { return k.name == name; });
}

}  // namespace

namespace {

// The --set overrides applied to the recipe's tree; `override_nodes` keeps the nodes they made (for
// messages that name --set). `model.name` (a zoo model) and `model.file` are alternatives:
// overriding one drops the other that the recipe file gave, so `--set
// model.file=runs/mnist/lenet5/model.h5` fine-tunes a run. A file also drops the recipe's
// weight_init: the file's model brings its own weights. A num_classes stays, checked against the
// file's classifier when the model is loaded.
void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides, const std::string& origin,
                     std::vector<YAML::Node>& override_nodes) {
  std::string model_source;
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (key != "model.name" && key != "model.file") continue;
    if (!model_source.empty() && model_source != key)
      usage_error("--set " + model_source + " and --set " + key + " both given: a model is either a zoo name or a file");
    model_source = key;
  }
  if (!model_source.empty() && root["model"].IsMap()) {
    if (model_source == "model.name") root["model"].remove("file");
    else
      for (const char* k : {"name", "weight_init"}) root["model"].remove(k);
  }
  for (const auto& o : overrides) set_override(root, o, origin, override_nodes);
}

// `model:`: a zoo name or a file (which must exist), classes, input shape.
void read_model_section(const YAML::Node& root, const std::string& origin, Recipe& r) {
  const YAML::Node m = root["model"];
  read_section(m, model_schema(), r.model, "model");
  if (!shape_within_limit(r.model.input_shape))
    usage_error(at_line(origin, m["input_shape"]) + ": 'model.input_shape' has more than 2^40 elements");
  if (r.model.name.empty() == r.model.file.empty())
    usage_error(at_line(origin, m) + ": 'model' needs exactly one of 'name' (a zoo model) or 'file'");
  if (!r.model.name.empty()) {
    const std::vector<std::string> zoo = zoo_models();
    if (std::find(zoo.begin(), zoo.end(), r.model.name) == zoo.end()) {
      std::string list, guess = closest_match(r.model.name, zoo);
      for (const auto& z : zoo) list += (list.empty() ? "" : ", ") + z;
      usage_error(at_line(origin, m["name"]) + ": 'model.name' is '" + r.model.name + "', not a zoo model (" + list +
                  ")" + (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
    }
  }
  if (!r.model.file.empty() && m["weight_init"])
    usage_error(at_line(origin, m["weight_init"]) +
                ": 'model.weight_init' applies to zoo models ('model.name'); the model of 'model.file' brings its own "
                "weights: drop the key");
  if (!r.model.file.empty() && !path_exists(r.model.file))
    usage_error(at_line(origin, m["file"]) + ": 'model.file': " + r.model.file +
                " does not exist (paths are relative to the directory whittle runs in)");
  if (r.model.num_classes < 1) usage_error(at_line(origin, m["num_classes"]) + ": 'model.num_classes' must be ≥ 1");
  if (!r.model.file.empty() && !m["num_classes"]) r.model.num_classes = 0;  // beside a file: not checked
}

// `data:`: the section, then the checks across its keys and that both paths exist.
void read_data_section_checked(const YAML::Node& root, const std::string& origin, Recipe& r) {
  const YAML::Node d = root["data"];
  for (const char* required : {"train", "test"})
    if (!d[required]) usage_error(at_line(origin, d) + ": missing key 'data." + std::string(required) + "'");
  read_data_section(d, r.data);
  if (r.data.mean.size() != r.data.std.size())
    usage_error(at_line(origin, d["mean"] ? d["mean"] : d) + ": 'data.mean' has " + std::to_string(r.data.mean.size()) +
                " entries and 'data.std' " + std::to_string(r.data.std.size()) + ": they must have the same length");
  for (double v : r.data.std)
    if (!(v > 0)) usage_error(at_line(origin, d["std"]) + ": 'data.std' entries must be > 0");
  for (const auto& [k, v] : {std::pair<const char*, int64_t>{"batch_size", r.data.batch_size},
                             {"eval_batch_size", r.data.eval_batch_size}, {"prefetch", r.data.prefetch}})
    if (v < 1) usage_error(at_line(origin, d[k]) + ": 'data." + k + "' must be ≥ 1");
  if (r.data.num_workers < 0) usage_error(at_line(origin, d["num_workers"]) + ": 'data.num_workers' must be ≥ 0");
  for (const auto& [k, p] : {std::pair<const char*, std::string*>{"train", &r.data.train}, {"test", &r.data.test}}) {
    if (!path_exists(*p))
      usage_error(at_line(origin, d[k]) + ": 'data." + k + "': " + *p + " does not exist (paths are relative to the directory whittle runs in)");
  }
}

// `training:`: epochs, optimizer, schedule and the rest, with the checks across keys.
void read_training_section(const YAML::Node& root, const std::string& origin, Recipe& r) {
  const YAML::Node t = root["training"];
  read_section(t, training_schema(), r.training, "training");
  if (const YAML::Node o = t["optimizer"]) {
    auto& op = r.training.optimizer;
    read_section(o, optimizer_schema(), op, "training.optimizer");
    if (op.fused && op.name != "sgd")
      usage_error(at_line(origin, o["fused"]) + ": 'training.optimizer.fused' applies to sgd, not " + op.name);
    // What LibTorch's SGD refuses when it is built, checked with the recipe (naming the keys).
    if (op.nesterov && op.name != "sgd")
      usage_error(at_line(origin, o["nesterov"]) + ": 'training.optimizer.nesterov' applies to sgd, not " + op.name);
    if (op.nesterov && !(op.momentum > 0))
      usage_error(at_line(origin, o["nesterov"]) + ": 'training.optimizer.nesterov' needs a momentum above 0 "
                  "('training.optimizer.momentum' is " + number_text(op.momentum) + ")");
    if (!(op.lr > 0)) usage_error(at_line(origin, o["lr"]) + ": 'training.optimizer.lr' must be > 0");
  }
  if (const YAML::Node s = t["lr_schedule"]) {
    auto& sc = r.training.lr_schedule;
    read_section(s, schedule_schema(), sc, "training.lr_schedule");
    if (sc.name == "step" && !(sc.step_size > 0)) usage_error(at_line(origin, s) + ": 'training.lr_schedule.step_size' must be > 0");
    if (sc.min_lr > r.training.optimizer.lr)
      usage_error(at_line(origin, s["min_lr"] ? s["min_lr"] : s) + ": 'training.lr_schedule.min_lr' " + number_text(sc.min_lr) +
                  " is above training.optimizer.lr " + number_text(r.training.optimizer.lr));
  }
  if (r.training.grad_accumulation < 1) usage_error(at_line(origin, t["grad_accumulation"]) + ": 'training.grad_accumulation' must be ≥ 1");
  const std::string& dev = r.training.device;
  if (!is_device_name(dev))
    usage_error(at_line(origin, t["device"]) + ": 'training.device' is '" + dev + "' (one of: cpu, cuda, cuda:N)");
}

// `distributed:` (data-parallel runs).
void read_distributed_section(const YAML::Node& root, Recipe& r) {
  read_section(root["distributed"], distributed_schema(), r.distributed, "distributed");
}

// `modifiers:`: each entry against the common keys and its modifier's own, its window inside
// training.epochs, its patterns.
void read_modifiers_section(const YAML::Node& root, const std::string& origin, const std::vector<std::string>& overrides, Recipe& r) {
  if (const YAML::Node mods = root["modifiers"]) {
    const std::vector<KeySpec> common = modifier_common_keys();
    for (size_t i = 0; i < mods.size(); ++i) {
      const YAML::Node e = mods[i];
      const std::string where = "modifiers." + std::to_string(i);
      if (!e.IsMap()) usage_error(at_line(origin, e) + ": '" + where + "' must be a section with a 'name'");
      if (!e["name"]) usage_error(at_line(origin, e) + ": '" + where + "' needs a 'name'");
      if (!e["name"].IsScalar()) usage_error(at_line(origin, e["name"]) + ": '" + where + ".name' must be a string, got " + node_kind(e["name"]));
      const std::string name = e["name"].Scalar();
      const ModifierInfo* info = nullptr;
      try {
        info = &modifier_info(name);
      } catch (const Error& err) {
        usage_error(at_line(origin, e["name"]) + ": '" + where + ".name': " + err.what());
      }
      std::vector<KeySpec> all = common;
      const std::vector<KeySpec> own_keys = modifier_settings(*info);
      all.insert(all.end(), own_keys.begin(), own_keys.end());
      validate_keys(e, all, origin, where, "'" + where + "' (" + name + ")");
      ModifierSpec ms;
      ms.name = name;
      ms.line = e.Mark().line + 1;
      ms.location = at_line(origin, e) + ", " + where;
      const std::string own = "modifiers." + std::to_string(i) + ".";
      if (std::any_of(overrides.begin(), overrides.end(), [&](const std::string& o) { return o.rfind(own, 0) == 0; }) &&
          ms.location.find("(--set)") == std::string::npos)
        ms.location += " (with --set)";
      const std::string entry = ms.location + ": modifier '" + name + "'";
      read_section(e, modifier_schema(), ms, where);
      if (ms.end_epoch != -1.0 && ms.end_epoch <= ms.start_epoch)
        usage_error(entry + ": end_epoch " + number_text(ms.end_epoch) + " is not after start_epoch " +
                    number_text(ms.start_epoch) + " (end_epoch −1 runs to the end)");
      // A window that opens after the run ends would silently do nothing. A run of 0 epochs
      // (calibration only) applies its modifiers once, at epoch 0.
      if (r.training.epochs == 0 && ms.start_epoch > 0)
        usage_error(entry + ": start_epoch " + number_text(ms.start_epoch) + ": training.epochs is 0 (calibration only" +
                    (overridden(r, "training.epochs") ? ", with --set" : "") + "), so every modifier applies at epoch 0");
      if (r.training.epochs > 0 && ms.start_epoch >= static_cast<double>(r.training.epochs))
        usage_error(entry + ": start_epoch " + number_text(ms.start_epoch) + " is not inside the run of " +
                    std::to_string(r.training.epochs) + " epoch(s) (training.epochs): the modifier would never apply");
      for (const auto* patterns : {&ms.targets, &ms.ignore})
        for (const auto& p : *patterns)
          if (p.empty()) usage_error(entry + ": an empty pattern in targets/ignore");
          else if (const std::string problem = pattern_problem(p); !problem.empty())
            usage_error(entry + ": " + problem);
      for (const auto& kv : e) {
        const std::string k = kv.first.as<std::string>();
        if (std::any_of(common.begin(), common.end(), [&](const KeySpec& c) { return c.name == k; })) continue;
        const auto spec = std::find_if(own_keys.begin(), own_keys.end(), [&](const KeySpec& c) { return c.name == k; });
        ms.settings[k] = setting_value(kv.second, *spec);
      }
      r.modifiers.push_back(std::move(ms));
    }
  }
}

// `outputs:`: the run directory (default runs/<recipe stem>), checkpoint and export files, kept
// off the names the run directory uses for itself.
void read_outputs_section(const YAML::Node& root, const std::string& origin, Recipe& r) {
  if (const YAML::Node o = root["outputs"]) {
    read_section(o, outputs_schema(), r.outputs, "outputs");
    const auto& f = r.outputs.export_formats;
    for (size_t i = 0; i < f.size(); ++i)
      if (std::find(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(i), f[i]) != f.begin() + static_cast<std::ptrdiff_t>(i))
        usage_error(at_line(origin, o["export"]) + ": 'outputs.export' names " + f[i] + " twice");
    // outputs.<format>_<option>: the exporter's own options, given only with that format.
    for (const auto& format : exporters().names())
      for (const KeySpec& k : exporter(format).option_keys()) {
        const std::string name = format + "_" + k.name;
        const YAML::Node v = o[name];
        if (!v || v.IsNull()) continue;
        if (std::find(f.begin(), f.end(), format) == f.end())
          usage_error(at_line(origin, v) + ": 'outputs." + name + "' applies when 'outputs.export' has " + format);
        r.outputs.export_options[format][k.name] = setting_value(v, k);
      }
  }
  if (r.outputs.dir.empty()) {
    std::string stem = origin.substr(origin.rfind('/') == std::string::npos ? 0 : origin.rfind('/') + 1);
    stem = stem.substr(0, stem.rfind('.'));
    r.outputs.dir = "runs/" + (stem.empty() ? std::string("run") : stem);
  }
  const std::string& ck = r.outputs.checkpoint;
  if (ck.empty() || ck.find('/') != std::string::npos || ck == "." || ck == "..")
    usage_error(origin + ": 'outputs.checkpoint' must be a plain file name, got '" + ck + "'");
  for (const std::string& reserved : run_files::reserved())
    if (ck == reserved)
      usage_error(origin + ": 'outputs.checkpoint' is '" + ck + "', a file the run directory already uses for itself");
  if (ck.front() == '.') usage_error(origin + ": 'outputs.checkpoint' '" + ck + "' must not start with '.'");
  for (const std::string& format : r.outputs.export_formats) {
    const std::string file = export_file_name(r.outputs, format);
    for (const std::string& reserved : run_files::reserved())
      if (file == reserved || file == ck)
        usage_error(origin + ": 'outputs.export' " + format + " would write '" + file + "', a file the run directory uses " +
                    "for itself; rename 'outputs.checkpoint'");
  }
}

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& origin, const std::string& base_dir,
                    const std::vector<std::string>& overrides) {
  YAML::Node root = load_yaml(text, origin);
  if (!root || root.IsNull()) usage_error(origin + ": the recipe is empty");
  if (!root.IsMap()) usage_error(at_line(origin, root) + ": the top level must be a section (key: value pairs)");
  register_builtin_modifiers();
  std::vector<YAML::Node> override_nodes;
  apply_overrides(root, overrides, origin, override_nodes);
  struct Scope {
    explicit Scope(std::vector<YAML::Node>* nodes) { t_override_nodes = nodes; }
    ~Scope() { t_override_nodes = nullptr; }
  } scope(&override_nodes);
  validate_keys(root, recipe_schema(), origin, "");
  for (const char* required : {"model", "data", "training"})
    if (!root[required]) usage_error(origin + ": missing section '" + std::string(required) + "'");

  Recipe r;
  r.path = origin;
  r.base_dir = base_dir;
  r.overrides = overrides;
  if (overrides.empty()) {
    r.text = text;
  } else {
    YAML::Emitter out;
    out << root;
    r.text = std::string("# ") + origin + " with --set " + [&] {
      std::string s;
      for (const auto& o : overrides) s += (s.empty() ? "" : " ") + o;
      return s;
    }() + "\n" + out.c_str() + "\n";
  }

  read_model_section(root, origin, r);
  read_data_section_checked(root, origin, r);
  read_training_section(root, origin, r);
  read_distributed_section(root, r);
  read_modifiers_section(root, origin, overrides, r);
  read_outputs_section(root, origin, r);
  return r;
}

std::vector<ModifierSpec> parse_recipe_modifiers(const std::string& text, const std::string& origin) {
  const YAML::Node root = load_yaml(text, origin);
  if (!root.IsMap() || !root["modifiers"] || root["modifiers"].IsNull()) return {};
  if (!root["modifiers"].IsSequence())
    usage_error(at_line(origin, root["modifiers"]) + ": 'modifiers' must be a list, got " + node_kind(root["modifiers"]));
  register_builtin_modifiers();
  Recipe r;
  r.training.epochs = std::numeric_limits<int64_t>::max();  // no training section: any window
  if (const YAML::Node t = root["training"]; t && t.IsMap() && t["epochs"]) get(t, "epochs", r.training.epochs);
  read_modifiers_section(root, origin, {}, r);
  return r.modifiers;
}

std::string export_file_name(const OutputsSpec& outputs, const std::string& format) {
  std::string stem = outputs.checkpoint;
  if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem = stem.substr(0, dot);
  return stem + exporter(format).extensions().front();
}

DataSpec parse_recipe_data(const std::string& text, const std::string& origin) {
  DataSpec out;
  const YAML::Node root = load_yaml(text, origin);
  if (!root.IsMap() || !root["data"] || root["data"].IsNull()) return out;
  validate_keys(root["data"], section_spec("data").children, origin, "data");
  read_data_section(root["data"], out);
  return out;
}

bool overridden(const Recipe& recipe, const std::string& key) {
  return std::any_of(recipe.overrides.begin(), recipe.overrides.end(), [&](const std::string& o) {
    const std::string path = o.substr(0, o.find('='));
    // The key itself, or a section holding it (--set training={epochs: 0}).
    return path == key || key.rfind(path + ".", 0) == 0;
  });
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  if (!path_exists(path)) usage_error(path + ": recipe file does not exist");
  if (!is_regular_file(path)) usage_error(path + ": the recipe is " + describe_path(path) + ", not a YAML file");
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    usage_error(e.what());
  }
  return parse_recipe(text, path, parent_directory(path), overrides);
}

}  // namespace whittle::runner
