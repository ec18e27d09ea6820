#include "runner/train_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/serialize/output-archive.h>

#include <archive.h>
#include <archive_entry.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <set>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "graph/serialize.h"
#include "runner/amp.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

using json = nlohmann::json;

at::Tensor int_tensor(int64_t v) { return at::tensor(v); }

/// Whether two recipe texts say the same: equal YAML once comments and layout are dropped (a
/// recipe whose comments were edited still resumes). Texts that do not parse compare as text.
bool same_recipe(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    return YAML::Dump(YAML::Load(a)) == YAML::Dump(YAML::Load(b));
  } catch (const YAML::Exception&) {
    return false;
  }
}

/// Reads every record of the zip archive at `path` (a LibTorch archive is a zip) through
/// libarchive, which checks each record against the CRC-32 the writer stored (PKWARE APPNOTE
/// 4.4.7). LibTorch's own reader skips those checks, so a flipped byte in a tensor would otherwise
/// load as a wrong value. Throws whittle::Error naming the path and the record.
void check_zip_records(const std::string& path) {
  archive* a = archive_read_new();
  struct Closer {
    archive* a;
    ~Closer() { archive_read_free(a); }
  } closer{a};
  archive_read_support_format_zip_seekable(a);
  auto damaged = [&](const std::string& what) {
    // libarchive's own words, unless they are about the locale (a damaged record name that is not
    // UTF-8: "Pathname cannot be converted from UTF-8 to current locale").
    const char* m = archive_error_string(a);
    const std::string why = m == nullptr ? "" : std::string(m).find("locale") != std::string::npos
                                                    ? ": a record name is damaged (not UTF-8)"
                                                    : ": " + std::string(m);
    return Error("--resume: " + path + " is not a readable training state (truncated or damaged): " + what + why);
  };
  if (archive_read_open_filename(a, path.c_str(), 1 << 16) != ARCHIVE_OK) throw damaged("not a zip archive");
  archive_entry* e = nullptr;
  std::vector<char> buffer(1 << 16);
  int rc;
  while ((rc = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
    std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "?";
    for (char& ch : name)  // a damaged name prints as what it is, not as control bytes
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    la_ssize_t got;
    while ((got = archive_read_data(a, buffer.data(), buffer.size())) > 0) {
    }
    if (got < 0) throw damaged("record " + name + " fails its check");
  }
  if (rc != ARCHIVE_EOF) throw damaged("its record directory cannot be read");
}

}  // namespace

void save_train_state(const std::string& path, const std::string& recipe_text, const TrainerState& state,
                      GraphModule& model, const std::vector<std::unique_ptr<Modifier>>& modifiers,
                      const torch::optim::Optimizer& optimizer, const LossScaler& scaler) {
  torch::serialize::OutputArchive a;
  a.write("format", int_tensor(kTrainStateFormat));
  a.write("recipe", c10::IValue(recipe_text));
  a.write("epoch", int_tensor(state.epoch));
  a.write("batch", int_tensor(state.batch));
  a.write("step", int_tensor(state.step));
  a.write("seen", int_tensor(state.seen));
  a.write("correct", int_tensor(state.correct));
  a.write("train_seconds", at::tensor(state.train_seconds, at::kDouble));
  a.write("world_size", at::tensor(state.world_size, at::kLong));
  a.write("loss_sum", at::tensor(state.loss_sum, at::kDouble));
  a.write("graph", c10::IValue(graph_to_json(model->graph())));
  torch::serialize::OutputArchive tensors;
  json frozen = json::array();
  for (const auto& p : model->named_parameters()) {
    tensors.write(p.key(), p.value().detach().cpu());
    if (!p.value().requires_grad()) frozen.push_back(p.key());
  }
  for (const auto& b : model->named_buffers()) tensors.write(b.key(), b.value().detach().cpu(), /*is_buffer=*/true);
  a.write("tensors", tensors);
  a.write("frozen", c10::IValue(frozen.dump()));
  json mods = json::array();
  for (const auto& m : modifiers) mods.push_back({{"name", m->spec().name}, {"state", m->state()}});
  a.write("modifiers", c10::IValue(mods.dump()));
  {
    torch::serialize::OutputArchive mt;
    bool any = false;
    for (size_t i = 0; i < modifiers.size(); ++i)
      for (const auto& [name, t] : modifiers[i]->state_tensors()) {
        mt.write(std::to_string(i) + "." + name, t.detach().cpu(), /*is_buffer=*/!t.requires_grad());
        any = true;
      }
    if (any) a.write("modifier_tensors", mt);
  }
  torch::serialize::OutputArchive optim;
  optimizer.save(optim);
  a.write("optimizer", optim);
  a.write("loss_scale", at::tensor(scaler.scale(), at::kDouble));
  a.write("loss_scale_clean_steps", int_tensor(scaler.clean_steps()));
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    a.write("cpu_rng", gen.get_state());
  }
  try {
    write_atomic(path, [&](const std::string& tmp) {
      // Through a FileSink: LibTorch's own file writer aborts the process on a full disk.
      FileSink sink(tmp);
      a.save_to([&](const void* data, size_t n) { return sink.write(data, n); });
      sink.close();
    });
  } catch (const std::exception& e) {
    throw Error("cannot write training state " + path + ": " + write_failure_reason(message_of(e), path));
  }
}

SavedTrainState SavedTrainState::read(const std::string& path, const std::string& recipe_text) {
  SavedTrainState s;
  s.path_ = path;
  if (!path_exists(path)) {
    const std::string dir = parent_directory(path);
    if (path_exists(join_path(dir, "metrics.jsonl")))
      throw Error("--resume: no training state at " + path + ": the run in " + dir +
                  " stopped before it saved one (its first epoch's files are there, but a run resumes from a "
                  "training state only); start it again with --overwrite, or always pass --resume auto");
    throw Error("--resume: no training state at " + path + " (nothing to resume)");
  }
  if (!is_regular_file(path))
    throw Error("--resume: the training state " + path + " is " + describe_path(path) + ", not a file");
  check_zip_records(path);
  torch::serialize::InputArchive& a = s.archive_;
  try {
    a.load_from(path);
  } catch (const std::exception& e) {
    // The first line of LibTorch's words only: after it come excerpts of the archive's TorchScript
    // code, which say nothing to the user.
    std::string why = message_of(e);
    why = why.substr(0, why.find('\n'));
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    throw Error("--resume: " + path + " is not a readable training state (truncated or damaged): " + why);
  }
  auto read_tensor = [&](const char* k) {
    at::Tensor t;
    if (!a.try_read(k, t)) throw Error("--resume: " + path + " lacks '" + k + "' (damaged training state)");
    return t;
  };
  auto read_string = [&](const char* k) {
    c10::IValue v;
    if (!a.try_read(k, v) || !v.isString())
      throw Error("--resume: " + path + " lacks '" + k + "' (damaged training state)");
    return v.toStringRef();
  };
  const int64_t format = read_tensor("format").item<int64_t>();
  if (format != kTrainStateFormat)
    throw Error("--resume: " + path + " is a training state of format " + std::to_string(format) +
                ", this whittle reads format " + std::to_string(kTrainStateFormat) +
                (format < kTrainStateFormat ? " (written by an older whittle; start the run again without --resume)"
                                            : " (written by a newer whittle)"));
  if (!same_recipe(read_string("recipe"), recipe_text))
    throw Error("--resume: the recipe differs from the one the training state " + path +
                    " was saved with (a resumed run must use the same recipe and --set overrides; the saved one is " +
                    parent_directory(path) + "/recipe.yaml)",
                ErrorKind::kUsage);
  s.state_.epoch = read_tensor("epoch").item<int64_t>();
  s.state_.batch = read_tensor("batch").item<int64_t>();
  s.state_.step = read_tensor("step").item<int64_t>();
  s.state_.seen = read_tensor("seen").item<int64_t>();
  s.state_.correct = read_tensor("correct").item<int64_t>();
  s.state_.loss_sum = read_tensor("loss_sum").item<double>();
  {
    at::Tensor t;  // optional: states of earlier whittles lack it
    s.state_.train_seconds = a.try_read("train_seconds", t) ? t.item<double>() : -1.0;
    at::Tensor w;  // its own tensor: try_read into a defined one copies into it
    s.state_.world_size = a.try_read("world_size", w) ? w.item<int64_t>() : 1;
  }
  s.graph_json_ = read_string("graph");
  try {
    for (const auto& f : json::parse(read_string("frozen"))) s.frozen_.push_back(f.get<std::string>());
    for (const auto& m : json::parse(read_string("modifiers")))
      s.modifiers_.emplace_back(m.at("name").get<std::string>(), m.at("state").get<std::string>());
  } catch (const json::exception& e) {
    throw Error("--resume: " + path + ": damaged training state: " + message_of(e));
  }
  s.loss_scale_ = read_tensor("loss_scale").item<double>();
  s.loss_scale_clean_steps_ = read_tensor("loss_scale_clean_steps").item<int64_t>();
  return s;
}

Graph SavedTrainState::take_graph() {
  if (graph_taken_) throw Error("SavedTrainState::take_graph: the graph was taken already");
  graph_taken_ = true;
  torch::serialize::InputArchive tensors;
  if (!archive_.try_read("tensors", tensors)) throw Error("--resume: " + path_ + " lacks 'tensors'");
  auto source = [&](const std::string& node, TensorRole role, const std::string& name, const Shape& shape,
                    at::ScalarType dtype) {
    const std::string key = node + "." + name;
    at::Tensor t;
    if (!tensors.try_read(key, t, /*is_buffer=*/role == TensorRole::kBuffer))
      throw Error("--resume: " + path_ + " lacks " + (role == TensorRole::kBuffer ? "buffer " : "tensor ") + key);
    if (t.sizes().vec() != shape || t.scalar_type() != dtype)
      throw Error("--resume: " + path_ + ": tensor " + key + " is " + shape_str(t.sizes().vec()) + " " +
                  dtype_name(t.scalar_type()) + ", the graph records " + shape_str(shape) + " " + dtype_name(dtype));
    return t;
  };
  // The ops and weight transforms the modifiers put in the graph are registered by the registry
  // lookups themselves (core/registration.h).
  Graph g = graph_from_json(graph_json_, source, path_);
  const std::set<std::string> frozen(frozen_.begin(), frozen_.end());
  for (auto& n : g.nodes())
    for (auto& kv : n.params)
      if (kv.second.defined() && frozen.count(n.name + "." + kv.first)) kv.second.set_requires_grad(false);
  return g;
}

void SavedTrainState::restore_modifiers(const std::vector<std::unique_ptr<Modifier>>& modifiers) const {
  if (modifiers.size() != modifiers_.size())
    throw Error("--resume: " + path_ + " holds the state of " + std::to_string(modifiers_.size()) +
                " modifiers, the recipe has " + std::to_string(modifiers.size()));
  for (size_t i = 0; i < modifiers.size(); ++i) {
    if (modifiers[i]->spec().name != modifiers_[i].first)
      throw Error("--resume: " + path_ + ": modifier " + std::to_string(i) + " was '" + modifiers_[i].first +
                  "', the recipe has '" + modifiers[i]->spec().name + "'");
    modifiers[i]->load_state(modifiers_[i].second);
  }
}

void SavedTrainState::restore_modifier_tensors(const std::vector<std::unique_ptr<Modifier>>& modifiers) {
  torch::serialize::InputArchive mt;
  const bool present = archive_.try_read("modifier_tensors", mt);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < modifiers.size(); ++i)
    for (auto& [name, t] : modifiers[i]->state_tensors()) {
      const std::string key = std::to_string(i) + "." + name;
      at::Tensor saved;
      if (!present || !mt.try_read(key, saved, /*is_buffer=*/!t.requires_grad()))
        throw Error("--resume: " + path_ + " lacks modifier " + std::to_string(i) + " ('" + modifiers[i]->spec().name +
                    "') tensor " + name);
      if (!saved.sizes().equals(t.sizes()))
        throw Error("--resume: " + path_ + ": modifier " + std::to_string(i) + " tensor " + name + " is " +
                    shape_str(saved.sizes().vec()) + ", the modifier has " + shape_str(t.sizes().vec()));
      t.copy_(saved);
    }
}

void SavedTrainState::restore_optimizer(torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive optim;
  if (!archive_.try_read("optimizer", optim)) throw Error("--resume: " + path_ + " lacks 'optimizer'");
  try {
    optimizer.load(optim);
  } catch (const std::exception& e) {
    throw Error("--resume: " + path_ + ": the saved optimizer state does not fit the model: " + message_of(e));
  }
}

void SavedTrainState::restore_loss_scaler(LossScaler& scaler) const {
  scaler.restore(loss_scale_, loss_scale_clean_steps_);
}

void SavedTrainState::restore_rng() {
  at::Tensor rng;
  if (!archive_.try_read("cpu_rng", rng)) throw Error("--resume: " + path_ + " lacks 'cpu_rng'");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace whittle::runner
