#include "runner/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/hdf5_dataset.h"
#include "data/load.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "export/exporter.h"
#include "graph/op_registry.h"
#include "graph/select.h"
#include "runner/model_loader.h"
#include "runner/optimizer.h"
#include "runner/progress.h"
#include "runner/run_files.h"

namespace whittle::runner {

namespace {

std::atomic<bool> g_stop{false};
using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

/// The files a finished run's exports are written to in `dir`: format → path.
std::map<std::string, std::string> export_paths(const OutputsSpec& outputs, const std::string& dir) {
  std::map<std::string, std::string> paths;
  for (const std::string& format : outputs.export_formats) paths[format] = join_path(dir, export_file_name(outputs, format));
  return paths;
}

/// Whether the run in `dir` is complete after `epochs` epochs: its report.json (the last file a run
/// writes) records them, its checkpoint is there at the size the report gives, and every export
/// (format → path) is there and in the report. Fills `result`'s test figures from the report. Anything else (no report,
/// an unreadable one, a missing checkpoint or export: stopped while finishing, or an export that
/// failed) means finish() still has work to do.
bool read_finished_report(const std::string& dir, const std::string& checkpoint,
                          const std::map<std::string, std::string>& exports, int64_t epochs, RunResult& result) {
  const std::string path = join_path(dir, run_files::kReport);
  if (!is_regular_file(path)) return false;
  const json r = json::parse(read_file(path), nullptr, false);
  auto number = [&](const char* k) { return r.is_object() && r.contains(k) && r[k].is_number(); };
  if (!number("epochs") || !r["epochs"].is_number_integer() || r["epochs"].get<int64_t>() != epochs ||
      !number("test_top1") || !number("test_top5") || !number("test_loss") || !number("test_images") ||
      !number("checkpoint_bytes"))
    return false;
  if (!is_regular_file(checkpoint) || file_size(checkpoint) != r["checkpoint_bytes"].get<int64_t>()) return false;
  for (const auto& [format, file] : exports)
    if (!r.contains("exports") || !r["exports"].is_object() || !r["exports"].contains(format) || !is_regular_file(file))
      return false;
  result.test.top1 = r["test_top1"].get<double>();
  result.test.top5 = r["test_top5"].get<double>();
  result.test.loss = r["test_loss"].get<double>();
  result.test.samples = r["test_images"].get<int64_t>();
  result.checkpoint_bytes = r["checkpoint_bytes"].get<int64_t>();
  result.epochs_done = epochs;
  return true;
}

/// The training rate (images/s) the last line of a run's metrics.jsonl records, 0 when none: the
/// report's rate when a resumed sitting only finished the run (it trained no images).
double last_epoch_rate(const std::string& metrics_path) {
  if (!is_regular_file(metrics_path)) return 0;
  std::istringstream in(read_file(metrics_path));
  double rate = 0;
  for (std::string l; std::getline(in, l);) {
    const json j = json::parse(l, nullptr, false);
    if (j.is_object() && j.contains("train_images_per_second") && j["train_images_per_second"].is_number())
      rate = j["train_images_per_second"].get<double>();
  }
  return rate;
}

// Clears TrainContext::input and train_batch, which refer to a step's locals, when the hooks that
// read them are done, also when one throws.
struct ClearBatch {
  TrainContext& tc;
  ~ClearBatch() {
    tc.input = nullptr;
    tc.train_batch = nullptr;
  }
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Parameters and MACs of one image (the graph's declared batch divided out).
NodeCost per_image_cost(const Graph& g) {
  NodeCost c = graph_cost(g);
  const Shape in = g.value(g.inputs().front()).shape;
  if (!in.empty() && in[0] > 1) c.macs /= in[0];
  return c;
}

// Indices (int64 [limit], increasing) of `limit` images of `ds`, class-balanced: taken in rounds,
// each round the next image of every class in dataset order, so that a class-sorted set (an image
// folder) still gives every class, and a shuffled one nearly its first `limit` images.
at::Tensor balanced_subset(const data::Dataset& ds, int64_t limit) {
  const at::Tensor labels = ds.labels.contiguous();
  const int64_t* y = labels.data_ptr<int64_t>();
  const int64_t n = ds.size();
  std::map<int64_t, int64_t> in_class;
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(n));  // (rank within its class, index)
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = {in_class[y[i]]++, i};
  std::sort(order.begin(), order.end());
  std::vector<int64_t> chosen;
  for (int64_t i = 0; i < limit; ++i) chosen.push_back(order[static_cast<size_t>(i)].second);
  std::sort(chosen.begin(), chosen.end());
  return at::tensor(chosen, at::kLong);
}

// The recipe's `data.<key>` set (key "train" or "test"), `limit` images of it, class-balanced
// (0: all). Throws whittle::Error naming the key for a set without images.
data::Dataset load_limited(const DataSpec& spec, const char* key, const std::string& path, const std::string& split,
                           int64_t limit, std::ostream& log) {
  data::Dataset ds = load_split(path, split, spec.pack_to, log);
  if (ds.size() == 0) throw Error("'data." + std::string(key) + "': " + path + " (split " + split + ") holds no images");
  if (limit > 0 && limit < ds.size()) ds = ds.subset(balanced_subset(ds, limit));
  return ds;
}

data::Transform make_transform(const DataSpec& spec, bool train) {
  data::Transform t;
  t.mean = spec.mean;
  t.stddev = spec.std;
  if (train) {
    t.padding = spec.random_crop_padding;
    t.flip_probability = spec.horizontal_flip ? 0.5 : 0.0;
  }
  return t;
}

// The recipe's model: a zoo model seeded with training.seed, or its file, with the declared input
// shape or the dataset's image shape (N = 1).
ModelSource model_source(const Recipe& r, const data::Dataset& train) {
  const ModelSpec& m = r.model;
  ModelSource s;
  s.name = m.name;
  s.file = m.file;
  s.num_classes = m.num_classes;
  s.weight_init = weight_init_from_name(m.weight_init);
  s.seed = static_cast<uint64_t>(r.training.seed);
  s.input_shape = m.input_shape.empty() ? Shape{1, train.channels(), train.height(), train.width()} : m.input_shape;
  return s;
}

}  // namespace

std::optional<NonFiniteGradient> find_non_finite_gradient(const std::vector<GraphModule>& modules) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const GraphModule& m : modules)
    for (const auto& p : m->parameters())
      if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  if (grads.empty()) return std::nullopt;
  // The largest |g| of every gradient (one fused kernel on CUDA), then their largest: finite unless
  // some value is NaN or infinite (a maximum of finite values cannot overflow); one synchronization.
  bool uniform = true;
  for (const auto& g : grads) uniform = uniform && g.scalar_type() == grads[0].scalar_type() && g.device() == grads[0].device();
  bool finite = true;
  if (uniform) {
    finite = std::isfinite(at::stack(at::_foreach_norm(grads, INFINITY)).max().item<double>());
  } else {
    for (const auto& g : grads) finite = finite && std::isfinite(g.abs().max().item<double>());
  }
  if (finite) return std::nullopt;
  // Only now the names, and the first parameter with such a value.
  for (const GraphModule& m : modules)
    for (const auto& p : m->named_parameters()) {
      const at::Tensor& g = p.value().grad();
      if (!g.defined()) continue;
      const int64_t bad = (~at::isfinite(g)).sum().item<int64_t>();
      if (bad > 0) return NonFiniteGradient{p.key(), bad};
    }
  return std::nullopt;
}

void require_finite_gradients(const std::vector<GraphModule>& modules) {
  if (const auto bad = find_non_finite_gradient(modules))
    throw Error("training step: the gradient of " + bad->parameter + " holds " + std::to_string(bad->count) +
                " NaN or infinite value" + (bad->count == 1 ? "" : "s"));
}

namespace {

// Scales the gradients so that their global L2 norm is at most `max_norm`.
void clip_gradient_norm(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  at::NoGradGuard g;
  double total = 0;
  for (auto& gr : grads) total += gr.pow(2).sum().item<double>();
  total = std::sqrt(total);
  if (total > max_norm)
    for (auto& gr : grads) gr.mul_(max_norm / (total + 1e-6));
}

}  // namespace

void request_stop() noexcept { g_stop.store(true); }

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    if (g_stop.load()) {
      if (sig == SIGINT) std::_Exit(130);  // second Ctrl-C: leave at once
      return;                              // SIGTERM after a stop request: the save is under way
    }
    request_stop();
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

EvalMetrics evaluate(GraphModule& model, data::DataLoader& loader, const at::Device& device, ProcessGroup* group) {
  model->eval();
  return evaluate([&model](const at::Tensor& x) { return model->forward(x); }, loader, device, group);
}

EvalMetrics evaluate(const std::function<at::Tensor(const at::Tensor&)>& forward, data::DataLoader& loader,
                     const at::Device& device, ProcessGroup* group) {
  at::NoGradGuard no_grad;
  EvalMetrics m;
  double loss_sum = 0;
  int64_t c1 = 0, c5 = 0;
  for (auto& batch : loader) {
    at::Tensor x = batch.images.to(device, /*non_blocking=*/true);
    at::Tensor y = batch.labels.to(device, true);
    at::Tensor logits = forward(x).to(at::kFloat);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    at::Tensor top = std::get<1>(logits.topk(k, 1));
    at::Tensor hit = top.eq(y.unsqueeze(1));
    c1 += hit.select(1, 0).sum().item<int64_t>();
    c5 += hit.any(1).sum().item<int64_t>();
    m.samples += y.size(0);
  }
  if (group) {
    const std::vector<double> all =
        group->sum({loss_sum, static_cast<double>(c1), static_cast<double>(c5), static_cast<double>(m.samples)});
    loss_sum = all[0];
    c1 = static_cast<int64_t>(all[1]);
    c5 = static_cast<int64_t>(all[2]);
    m.samples = static_cast<int64_t>(all[3]);
  }
  if (m.samples > 0) {
    m.top1 = static_cast<double>(c1) / static_cast<double>(m.samples);
    m.top5 = static_cast<double>(c5) / static_cast<double>(m.samples);
    m.loss = loss_sum / static_cast<double>(m.samples);
  }
  return m;
}

data::Dataset load_split(const std::string& path, const std::string& split, const std::string& pack_to,
                         std::ostream& log) {
  data::LoadOptions opts;
  opts.split = split;
  std::string resolved = path;
  const data::DatasetFormat format = data::detect_format(path, opts, &resolved);
  const bool decodes_images =
      format == data::DatasetFormat::kImageFolder || format == data::DatasetFormat::kImageArchive;
  if (pack_to.empty() || !decodes_images) return data::load_dataset(path, opts);
  make_directories(pack_to);
  std::string stem = resolved;
  while (!stem.empty() && stem.back() == '/') stem.pop_back();
  stem = stem.substr(stem.rfind('/') == std::string::npos ? 0 : stem.rfind('/') + 1);
  for (const char* ext : {".tar.gz", ".tgz", ".tar"})
    if (stem.size() > std::strlen(ext) && stem.compare(stem.size() - std::strlen(ext), std::strlen(ext), ext) == 0)
      stem.resize(stem.size() - std::strlen(ext));
  const std::string packed = join_path(pack_to, stem + "-" + split + ".h5");
  if (is_regular_file(packed)) return data::read_hdf5_dataset(packed);
  log << "packing " << resolved << " (" << split << ") to " << packed << " (first use)\n" << std::flush;
  const auto t0 = Clock::now();
  data::Dataset ds = data::load_dataset(path, opts);
  data::write_hdf5_dataset(ds, packed);
  log << "  " << ds.size() << " images in " << std::fixed << std::setprecision(1) << seconds_since(t0) << " s\n";
  return ds;
}

at::Device open_device(const std::string& name) {
  if (!is_device_name(name)) throw Error("device '" + name + "': expected cpu, cuda or cuda:N", ErrorKind::kUsage);
  const at::Device device(name);
  if (!device.is_cuda()) return device;
  if (!at::hasCUDA()) throw Error("device '" + name + "' requested but no CUDA device is available", ErrorKind::kUsage);
  const auto count = static_cast<int64_t>(at::getNumGPUs());
  if (device.has_index() && device.index() >= count)
    throw Error("device '" + name + "' requested but LibTorch sees " + std::to_string(count) + " CUDA device(s)",
                ErrorKind::kUsage);
  return device;
}

// ---------------------------------------------------------------- Trainer

Trainer::Trainer(const Recipe& r, const RunOptions& options)
    : recipe_(r),
      options_(options),
      log_(options.log ? options.log : &std::cout),
      group_(options.group),
      writer_(!options.group || options.group->rank() == 0),
      t_start_(Clock::now()) {
  if (!writer_) log_ = &null_log_;
  result_.world_size = group_ ? group_->world_size() : 1;
  state_.world_size = result_.world_size;
  open_run_directory();
  set_up_device();
  make_loaders();
  // The model: from the recipe, or on resume as it was at the save (the modifiers may have changed it).
  std::unique_ptr<SavedTrainState> saved = read_saved_state();
  build_model_and_modifiers(saved.get());
  // Everything is checked: from here on the run directory is written.
  create_run_directory();
  start_training(saved.get());
  if (saved) restore_position(*saved);
  if (group_) set_up_data_parallel();
  result_.global_batch_size = recipe_.data.batch_size * recipe_.training.grad_accumulation * result_.world_size;
  if (options_.resume) run_dir_.written = true;  // the run's files are there already
  log_start();
}

void Trainer::open_run_directory() {
  // A Ctrl-C that came before the Trainer (while the recipe was read) counts: checked in
  // create_run_directory() before the run directory is created.
  result_.run_dir = options_.out_dir.empty() ? recipe_.outputs.dir : options_.out_dir;
  const std::string& dir = result_.run_dir;
  result_.checkpoint = join_path(dir, recipe_.outputs.checkpoint);
  state_path_ = join_path(dir, run_files::kTrainState);
  if (options_.resume && options_.overwrite)
    throw Error("--resume continues the run in " + dir + " and --overwrite replaces it: give one", ErrorKind::kUsage);
  if (options_.resume && recipe_.training.epochs == 0) {
    // A calibration saves no training state: a finished one has nothing to resume (as a finished
    // training run), anything else is run again.
    if (!read_finished_report(dir, result_.checkpoint, export_paths(recipe_.outputs, dir), 0, result_))
      throw Error(std::string("--resume: training.epochs is 0 (calibration only") +
                      (overridden(recipe_, "training.epochs") ? ", with --set" : "") +
                      "), which saves no training state, and " + dir +
                      " holds no finished calibration: run it again (--overwrite replaces what is there)",
                  ErrorKind::kUsage);
    result_.finished_before = true;
    *log_ << "the run in " << dir << " has finished (calibration only, report.json): nothing to resume\n";
  }

  // The run directory must be usable before any work starts, but nothing is created until the
  // recipe has been checked against the data and the model. Only rank 0 writes it.
  if (!writer_) return;
  try {
    check_directory_creatable(dir);
  } catch (const Error& e) {
    throw Error("output directory " + dir + " cannot be written: " + e.what());
  }
  if (is_directory(dir)) {
    run_dir_.lock = std::make_unique<DirectoryLock>(dir, "whittle run");
    // A run killed while writing left a hidden temporary; the file it was for is whole.
    remove_stale_temporaries(dir);
    check_previous_run();
  }
}

void Trainer::set_up_device() {
  const TrainingSpec& t = recipe_.training;
  device_ = open_device(options_.device.empty() ? t.device : options_.device);
  if (t.threads > 0) at::set_num_threads(static_cast<int>(t.threads));
  at::manual_seed(static_cast<uint64_t>(t.seed));
  auto& ctx = at::globalContext();
  if (t.deterministic) ctx.setDeterministicAlgorithms(true, false);
  if (device_.is_cuda()) {
    ctx.setBenchmarkCuDNN(t.cudnn_benchmark && !t.deterministic);
    ctx.setDeterministicCuDNN(t.deterministic);
  }
}

void Trainer::make_loaders() {
  const Recipe& r = recipe_;
  const TrainingSpec& t = r.training;
  std::ostream& log = *log_;
  // Image folders are packed to HDF5 on first use: rank 0 packs, the others then read its copy.
  const bool pack_first = group_ && !r.data.pack_to.empty();
  // Packing a large image folder may outlast distributed.timeout_seconds: the others wait a day.
  constexpr double kPackWaitSeconds = 86400;
  if (pack_first && !writer_) group_->barrier(kPackWaitSeconds);
  data::Dataset train = load_limited(r.data, "train", r.data.train, r.data.train_split, r.data.train_limit, log);
  data::Dataset test = load_limited(r.data, "test", r.data.test, r.data.test_split, r.data.test_limit, log);
  if (pack_first && writer_) group_->barrier(kPackWaitSeconds);
  data::LoaderOptions train_opts;
  train_opts.batch_size = r.data.batch_size;
  train_opts.shuffle = true;
  train_opts.drop_last = r.data.drop_last;
  train_opts.seed = static_cast<uint64_t>(t.seed);
  train_opts.num_workers = static_cast<int>(r.data.num_workers);
  train_opts.prefetch_batches = static_cast<int>(r.data.prefetch);
  train_opts.pin_memory = device_.is_cuda();
  // A run of 0 epochs reads training batches only to calibrate: with the evaluation transforms.
  train_opts.transform = make_transform(r.data, t.epochs > 0);
  data::LoaderOptions test_opts = train_opts;
  test_opts.batch_size = r.data.eval_batch_size;
  test_opts.shuffle = false;
  test_opts.drop_last = false;
  test_opts.transform = make_transform(r.data, false);
  if (group_) {  // the distributed sampler: each rank its shard of every epoch
    train_opts.num_replicas = test_opts.num_replicas = group_->world_size();
    train_opts.rank = test_opts.rank = group_->rank();
    test_opts.even_shards = false;  // every test image once
  }
  const int64_t train_images = train.size();
  train_loader_ = std::make_unique<data::DataLoader>(std::move(train), train_opts);
  test_loader_ = std::make_unique<data::DataLoader>(std::move(test), test_opts);
  if (train_loader_->num_batches() == 0)
    throw Error(r.path + ": 'data.batch_size' " + std::to_string(r.data.batch_size) + " is more than the " +
                    std::to_string(train_loader_->shard_size()) + " training images" +
                    (group_ ? " of this rank's shard (" + std::to_string(train_images) + " over " +
                                  std::to_string(group_->world_size()) + " ranks)"
                            : std::string()) +
                    " and data.drop_last is true: " +
                    (t.epochs == 0 ? std::string("there is no batch to calibrate from") : "an epoch would make no optimizer step"),
                ErrorKind::kUsage);
  check_modifier_windows();
  if (t.epochs > 0 && t.grad_accumulation > train_loader_->num_batches())
    throw Error(r.path + ": 'training.grad_accumulation' " + std::to_string(t.grad_accumulation) + " is more than the " +
                    std::to_string(train_loader_->num_batches()) + " batches of an epoch",
                ErrorKind::kUsage);
  {
    const auto& a = train_loader_->dataset().class_names;
    const auto& b = test_loader_->dataset().class_names;
    if (!a.empty() && !b.empty() && a != b)
      throw Error(r.path + ": 'data.train' has " + std::to_string(a.size()) + " classes (" + a.front() + ", ...) and "
                      "'data.test' " + std::to_string(b.size()) + " (" + b.front() + ", ...): the class names differ",
                  ErrorKind::kUsage);
  }
  if (t.amp != "none" && !device_.is_cuda())
    throw Error(r.path + ": 'training.amp' " + t.amp + " applies to CUDA devices; the run is on " + device_.str(),
                ErrorKind::kUsage);
}

std::unique_ptr<SavedTrainState> Trainer::read_saved_state() const {
  // (A pointer, not std::optional: clang 14 rejects std::optional for this type.)
  if (!options_.resume || recipe_.training.epochs == 0) return nullptr;  // a calibration saves none
  try {
    return std::make_unique<SavedTrainState>(SavedTrainState::read(state_path_, recipe_.text));
  } catch (const Error& e) {
    if (writer_) throw;
    throw Error(std::string(e.what()) + " (on resume every rank reads the training state: the run directory must be on a "
                "file system every rank sees)");
  }
}

void Trainer::build_model_and_modifiers(SavedTrainState* saved) {
  const Recipe& r = recipe_;
  model_ = GraphModule(saved ? saved->take_graph() : load_model(model_source(r, train_loader_->dataset())));
  model_->to(device_);
  // Modifiers (their settings checked by their factories, their patterns against the model).
  for (const auto& spec : r.modifiers) modifiers_.push_back(modifier_info(spec.name).create(spec));
  if (r.training.epochs == 0)
    for (const auto& m : modifiers_)
      if (const std::string note = m->without_training_note(); !note.empty())
        *log_ << "note: " << m->spec().location << ": " << note << "\n";
  if (r.training.epochs == 0)
    for (const auto& m : modifiers_)
      if (const std::string why = m->needs_training(); !why.empty())
        throw Error(m->spec().location + ": modifier '" + m->spec().name + "' needs training (" + why +
                        "), and training.epochs is 0 (calibration only" +
                        (overridden(r, "training.epochs") ? ", with --set" : "") + ")",
                    ErrorKind::kUsage);
  if (!saved) check_modifier_targets();
  check_input_shapes();
  check_export_forms();
  if (!r.training.activation_checkpointing.empty()) {
    try {
      model_->set_checkpoint_segments(r.training.activation_checkpointing);
    } catch (const Error& e) {
      throw Error(recipe_.path + ": 'training.activation_checkpointing': " + e.what(), ErrorKind::kUsage);
    }
  }
}

void Trainer::create_run_directory() {
  // Every rank gets here: they agree whether a Ctrl-C (or torchrun's SIGTERM) came in time.
  if (group_ ? group_->any(g_stop.load()) : g_stop.load())
    throw Interrupted("interrupted before training started; nothing was written");
  if (writer_ && !run_dir_.lock) {
    const std::string& dir = result_.run_dir;
    make_directories(dir);
    run_dir_.path = dir;
    run_dir_.created = true;
    run_dir_.lock = std::make_unique<DirectoryLock>(dir, "whittle run");
  }
}

void Trainer::start_training(SavedTrainState* saved) {
  const TrainingSpec& t = recipe_.training;
  tc_.model = model_;
  tc_.recipe = &recipe_;
  tc_.device = device_;
  tc_.log = log_;
  if (group_) {
    tc_.replica_sum = replica_sum(group_);
    tc_.rank = group_->rank();
  }
  tc_.train_batches = train_loader_->num_batches();
  if (saved) saved->restore_modifiers(modifiers_);
  for (auto& m : modifiers_) m->on_start(tc_);
  if (saved) saved->restore_modifier_tensors(modifiers_);
  apply_parameter_changes();
  optimizer_ = make_optimizer(t.optimizer, optimized_parameters(), weight_decay_overrides(parameter_modules(), t.optimizer));
  tc_.optimizer = optimizer_.get();
  if (t.channels_last && device_.is_cuda()) {
    at::NoGradGuard g;
    for (auto& p : model_->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
  scaler_ = LossScaler(device_.is_cuda() && t.amp == "fp16");
  autocast_ = device_.is_cuda() && t.amp != "none";
}

void Trainer::restore_position(SavedTrainState& saved) {
  const Recipe& r = recipe_;
  const std::string& dir = result_.run_dir;
  std::ostream& log = *log_;
  saved.restore_optimizer(*optimizer_);
  saved.restore_loss_scaler(scaler_);
  state_ = saved.state();
  // Inside an epoch `batch` counts each rank's batches: it means another position with another
  // number of ranks. At an epoch boundary any number of ranks may continue.
  if (state_.batch > 0 && state_.world_size != result_.world_size) {
    if (group_) group_->mark_failed_together();  // every rank read the same state
    throw Error("--resume: " + state_path_ + " stopped inside epoch " + std::to_string(state_.epoch + 1) + " with " +
                    std::to_string(state_.world_size) + " rank(s); this run has " + std::to_string(result_.world_size) +
                    ": resume it with " + std::to_string(state_.world_size) + " (or from an epoch's end)",
                ErrorKind::kUsage);
  }
  state_.world_size = result_.world_size;
  tc_.step = state_.step;
  result_.epochs_done = state_.epoch;
  saved.restore_rng();
  bool finished = state_.epoch >= r.training.epochs &&
                  read_finished_report(dir, result_.checkpoint, export_paths(r.outputs, dir), state_.epoch, result_);
  // Every rank reads the same files; should one see them otherwise (a network file system's
  // cache), all finish the run again rather than some waiting for the others.
  if (group_) finished = !group_->any(!finished);
  if (finished) {
    result_.finished_before = true;
    log << "the run in " << dir << " has finished (epoch " << state_.epoch << " of " << r.training.epochs
        << ", report.json): nothing to resume\n";
  } else {
    log << "resuming " << dir << " at epoch " << state_.epoch + 1 << ", batch " << state_.batch << "\n";
  }
  if (!writer_) {  // the saved running sums are all ranks' so far: rank 0 carries them
    state_.loss_sum = 0;
    state_.correct = 0;
    state_.seen = 0;
  }
}

void Trainer::set_up_data_parallel() {
  const Recipe& r = recipe_;
  DataParallelOptions dp;
  dp.bucket_cap_mb = r.distributed.bucket_cap_mb;
  dp.find_unused_parameters = r.distributed.find_unused_parameters;
  dp.broadcast_buffers = r.distributed.broadcast_buffers;
  dp.sync_batchnorm = r.distributed.sync_batchnorm;
  // Broadcasts rank 0's parameters and buffers: every rank starts from one model.
  // A modifier's parameters that only get gradients inside its epoch window (distill hint
  // adapters) would stall the gradient buckets outside it: the reducer is told to expect that.
  for (auto& m : modifiers_)
    if (!m->parameters().empty() && (m->spec().start_epoch > 0 || m->spec().end_epoch >= 0)) dp.find_unused_parameters = true;
  std::vector<at::Tensor> all = model_->parameters();  // frozen ones too: one model everywhere
  for (auto& m : modifiers_)
    for (auto& p : m->parameters()) all.push_back(p);
  ddp_ = std::make_unique<DistributedDataParallel>(group_, all, model_->buffers(), dp);
  result_.distributed_backend = group_->backend();
}

void Trainer::log_start() {
  const Recipe& r = recipe_;
  std::ostream& log = *log_;
  const NodeCost cost = per_image_cost(model_->graph());
  result_.params = cost.params;
  result_.macs = cost.macs;
  log << "model " << (r.model.name.empty() ? r.model.file : r.model.name) << ": " << cost.params << " parameters, "
      << cost.macs << " MACs/image; data: "
      << (group_ ? train_loader_->dataset().size() : train_loader_->num_samples()) << " train / "
      << test_loader_->dataset().size() << " test images; device " << device_.str() << "\n";
  if (group_)
    log << "data parallel: " << group_->world_size() << " ranks (" << group_->backend() << "), each training "
        << train_loader_->num_samples() << " images an epoch in batches of " << r.data.batch_size << " and testing "
        << test_loader_->num_samples() << "; " << result_.global_batch_size << " images a step\n";
  if (optimizer_->param_groups().size() > 1) {  // norm_weight_decay, bias_weight_decay
    log << "optimizer: weight decay";
    for (const auto& g : optimizer_->param_groups())
      log << (&g == &optimizer_->param_groups().front() ? " " : "; ") << weight_decay_of(g.options()).value_or(0)
          << " on " << g.params().size() << " tensors";
    log << "\n";
  }
  log << std::flush;
  const bool tty = log_ == &std::cout && ::isatty(STDOUT_FILENO);  // false for ranks other than 0
  progress_ = std::make_unique<ProgressBar>(log, tty, r.training.log_every);
}

Trainer::~Trainer() = default;

Trainer::RunDirectory::~RunDirectory() {
  lock.reset();
  // A run that failed before writing anything leaves no directory behind (only one it created).
  if (!created || written) return;
  try {
    if (list_directory(path).empty()) remove_tree(path);
  } catch (const std::exception&) {
  }
}

void Trainer::start_writing() {
  if (run_dir_.written) return;
  // A new run's files replace the previous run's (with --overwrite) only now, once it has
  // something to write: a run that fails in its first epoch leaves the old one as it was.
  const std::string& dir = result_.run_dir;
  if (options_.overwrite) remove_file(join_path(dir, run_files::kReport));
  // A run of 0 epochs saves no training state: one left by the run it replaces would be resumable.
  if (options_.overwrite && recipe_.training.epochs == 0) remove_file(join_path(dir, run_files::kTrainState));
  // Whatever a run killed from here on leaves holds a metrics.jsonl (check_previous_run): a new one
  // is written first, and taken back should the recipe's write fail (a full disk), leaving the
  // directory as it was; one already there (--overwrite) is emptied last, kept should that fail.
  const std::string metrics = join_path(dir, run_files::kMetrics);
  if (path_exists(metrics)) {
    write_file_atomic(join_path(dir, run_files::kRecipe), recipe_.text);
    write_file_atomic(metrics, "");
  } else {
    write_file_atomic(metrics, "");
    try {
      write_file_atomic(join_path(dir, run_files::kRecipe), recipe_.text);
    } catch (...) {
      remove_file(metrics);
      throw;
    }
  }
  run_dir_.written = true;
}

std::vector<std::string> Trainer::run_files() const {
  std::vector<std::string> files{recipe_.outputs.checkpoint, run_files::kTrainState, run_files::kMetrics, run_files::kReport,
                                 run_files::kRecipe};
  for (const std::string& format : recipe_.outputs.export_formats)
    files.push_back(export_file_name(recipe_.outputs, format));
  return files;
}

void Trainer::check_previous_run() const {
  const std::string& dir = result_.run_dir;
  // The checkpoint a new run writes must not be the model it starts from (a pruned model written
  // to runs/x/model.h5, then a run into runs/x): the first epoch's end would replace it.
  if (!options_.resume && !recipe_.model.file.empty() && path_exists(recipe_.model.file) &&
      resolved_path(recipe_.model.file) == resolved_path(result_.checkpoint))
    throw Error("model.file " + recipe_.model.file + " is the checkpoint this run writes (" + result_.checkpoint +
                    "): --out DIR writes the run elsewhere",
                ErrorKind::kUsage);
  if (options_.resume || options_.overwrite) return;
  std::string found;
  bool saved = false;
  for (const std::string& f : run_files())
    if (path_exists(join_path(dir, f))) {
      found += (found.empty() ? "" : ", ") + f;
      saved = saved || f == run_files::kTrainState || f == run_files::kReport;
    }
  // Without a training state or a report, no run saved an epoch there. A run's first write (at the
  // end of its first epoch, or when it is stopped) is metrics.jsonl, so a folder holding it is what a
  // run killed before its training state left: run again. The run's file names without it (a
  // model.h5 or recipe.yaml of the user's own) are not a run's, and are not replaced unasked.
  if (!saved) {
    if (found.empty() || path_exists(join_path(dir, run_files::kMetrics))) return;
    throw Error("run directory " + dir + " holds " + found +
                    " but no metrics.jsonl, so no whittle run left them; a run would replace them: --overwrite "
                    "replaces them, --out DIR writes elsewhere",
                ErrorKind::kUsage);
  }
  const bool finished = path_exists(join_path(dir, run_files::kReport));
  throw Error("run directory " + dir + " already holds " + (finished ? "a finished run" : "a run") + " (" + found + "): " +
                  (recipe_.training.epochs == 0 ? "" : "--resume continues it, ") +
                  "--overwrite replaces it, --out DIR writes elsewhere",
              ErrorKind::kUsage);
}

void Trainer::check_modifier_windows() const {
  if (recipe_.training.epochs == 0) return;  // every window opens at epoch 0 (read_recipe checked)
  // A step's fractional epoch is epoch + batch / batches; the last step's is
  // (epochs − 1) + (batches − 1) / batches. A window must open at or before it.
  const int64_t batches = train_loader_->num_batches();
  const double last = static_cast<double>(recipe_.training.epochs - 1) +
                      static_cast<double>(batches - 1) / static_cast<double>(batches);
  for (const auto& m : recipe_.modifiers)
    if (m.start_epoch > last)
      throw Error(m.location + ": modifier '" + m.name + "': start_epoch " + SettingValue(m.start_epoch).text() +
                      " is after the run's last step (epoch " + SettingValue(last).text() + ", with " +
                      std::to_string(batches) + " batches an epoch): the modifier would never apply",
                  ErrorKind::kUsage);
}

void Trainer::check_input_shapes() const {
  const Graph& g = model_->graph();
  if (g.outputs().size() == 1) {
    const Shape& out = g.value(g.outputs().front()).shape;
    const int64_t classes = out.size() == 2 ? out[1] : 0;
    if (!recipe_.model.file.empty() && recipe_.model.num_classes > 0 && classes > 0 && classes != recipe_.model.num_classes)
      throw Error(recipe_.path + ": 'model.num_classes' is " + std::to_string(recipe_.model.num_classes) +
                      " but the model of 'model.file' " + recipe_.model.file + " has " + std::to_string(classes) + " outputs",
                  ErrorKind::kUsage);
    for (const auto& [key, loader] : {std::pair<const char*, const data::DataLoader*>{"train", train_loader_.get()},
                                      {"test", test_loader_.get()}}) {
      const data::Dataset& ds = loader->dataset();
      const int64_t labels = ds.labels.numel() ? ds.labels.max().item<int64_t>() + 1 : 0;
      if (classes > 0 && labels > classes)
        throw Error(recipe_.path + ": 'data." + key + "' has labels up to " + std::to_string(labels - 1) +
                        " but the model has " + std::to_string(classes) + " outputs (model.num_classes)",
                    ErrorKind::kUsage);
    }
  }
  if (g.inputs().size() != 1) return;
  const Shape& in = g.value(g.inputs().front()).shape;
  // A checkpoint records its input shape: a declared one that differs would be silently unused.
  const Shape& declared = recipe_.model.input_shape;
  if (!recipe_.model.file.empty() && !declared.empty() &&
      (declared.size() != in.size() || !std::equal(declared.begin() + 1, declared.end(), in.begin() + 1)))
    throw Error(recipe_.path + ": 'model.input_shape' is " + shape_str(declared) + " but the model of 'model.file' " +
                    recipe_.model.file + " takes " + shape_str(in) + " (a checkpoint records its input; drop the key)",
                ErrorKind::kUsage);
  if (in.size() != 4) return;
  const Shape want(in.begin() + 1, in.end());
  for (const auto& [key, loader] : {std::pair<const char*, const data::DataLoader*>{"train", train_loader_.get()},
                                    {"test", test_loader_.get()}}) {
    const data::Dataset& ds = loader->dataset();
    const Shape got{ds.channels(), ds.height(), ds.width()};
    if (got != want)
      throw Error(recipe_.path + ": 'data." + key + "' images are " + shape_str(got) + " (C, H, W) but the model '" +
                      (recipe_.model.name.empty() ? recipe_.model.file : recipe_.model.name) + "' takes " +
                      shape_str(want) + " (its input " + shape_str(in) + ")",
                  ErrorKind::kUsage);
  }
}

Settings Trainer::export_options(const std::string& format) const {
  auto it = recipe_.outputs.export_options.find(format);
  return it == recipe_.outputs.export_options.end() ? Settings{} : it->second;
}

void Trainer::check_export_forms() const {
  // A dry run of each export on the model as loaded: an op or attribute without a form is
  // reported now, not after the last epoch (modifiers only add ops that have forms).
  for (const std::string& format : recipe_.outputs.export_formats) {
    try {
      exporter(format).check(model_->graph(), export_options(format));
    } catch (const Error& e) {
      throw Error(recipe_.path + ": 'outputs.export' " + format + ": " + e.what() + " (docs/export.md)", ErrorKind::kUsage);
    }
  }
}

void Trainer::check_modifier_targets() const {
  const Graph& g = model_->graph();
  for (const auto& m : recipe_.modifiers) {
    try {
      require_matches(g, m.targets, "target");
      require_matches(g, m.ignore, "ignore");
    } catch (const Error& e) {
      throw Error(m.location + ": modifier '" + m.name + "': " + e.what(), ErrorKind::kUsage);
    }
  }
  // A layer belongs to one entry of each modifier kind (two quantize entries on one layer: the
  // second would find it quantized already), or to a chain of stages each taking it over from the
  // last (progressive bit widths).
  std::map<std::pair<std::string, std::string>, const Modifier*> owner;  // (kind, layer) → entry
  for (const auto& m : modifiers_) {
    std::vector<std::string> shared;
    const Modifier* first = nullptr;
    std::string mismatch;  // why `m` is no later stage of `first`, when it looks like one
    for (const std::string& layer : m->claimed_layers(g)) {
      auto [it, fresh] = owner.emplace(std::make_pair(m->spec().name, layer), m.get());
      if (fresh) continue;
      if (m->takes_over(*it->second)) {  // a later stage: the layer is its now
        it->second = m.get();
        continue;
      }
      if (!first) {
        first = it->second;
        mismatch = m->stage_mismatch(*first);
      }
      if (it->second == first) shared.push_back(layer);
    }
    if (!first) continue;
    std::string list;
    for (size_t i = 0; i < shared.size() && i < 6; ++i) list += (i ? ", " : "") + shared[i];
    if (shared.size() > 6) list += ", ... (" + std::to_string(shared.size()) + " layers)";
    throw Error(m->spec().location + ": modifier '" + m->spec().name + "' selects " + list + ", which " +
                    first->spec().location + " already " + m->spec().name + "s: give the entries disjoint "
                    "targets (or ignore) so that each layer has one" +
                    (mismatch.empty() ? "" : "; as a later stage of progressive bit widths it needs " + mismatch),
                ErrorKind::kUsage);
  }
}

std::vector<GraphModule> Trainer::parameter_modules() {
  std::vector<GraphModule> out{model_};
  for (auto& m : modifiers_)
    for (auto& module : m->parameter_modules()) out.push_back(module);
  return out;
}

std::vector<at::Tensor> Trainer::optimized_parameters() {
  std::vector<at::Tensor> params = trainable_parameters(model_);
  for (auto& m : modifiers_)
    for (auto& p : m->parameters()) params.push_back(p);
  return params;
}

void Trainer::apply_parameter_changes() {
  if (!tc_.parameters_changed) return;
  model_->to(device_);
  if (optimizer_) {
    const OptimizerSpec& o = recipe_.training.optimizer;
    optimizer_ = rebuild_optimizer(*optimizer_, optimized_parameters(), weight_decay_overrides(parameter_modules(), o),
                                   o.weight_decay);
    tc_.optimizer = optimizer_.get();
  }
  // Every rank made the same change (the modifiers see the same parameters and step).
  if (ddp_) ddp_->set_parameters(optimized_parameters(), model_->buffers());
  tc_.parameters_changed = false;
}

void Trainer::sum_epoch_over_ranks() {
  if (!group_) return;
  const std::vector<double> all = group_->sum({state_.loss_sum, static_cast<double>(state_.correct),
                                               static_cast<double>(state_.seen), static_cast<double>(epoch_images_)});
  const bool root = group_->rank() == 0;  // after the sum, rank 0 holds the totals, the others nothing
  state_.loss_sum = root ? all[0] : 0.0;
  state_.correct = root ? static_cast<int64_t>(all[1]) : 0;
  state_.seen = root ? static_cast<int64_t>(all[2]) : 0;
  epoch_images_ = static_cast<int64_t>(all[3]);
}

void Trainer::step(const data::Batch& batch) {
  const TrainingSpec& t = recipe_.training;
  const int64_t index = state_.batch;
  const int64_t batches = train_loader_->num_batches();
  tc_.epoch = static_cast<double>(state_.epoch) + static_cast<double>(index) / static_cast<double>(batches);
  // One model on every rank before the modifiers look at it: each rank's last forward moved its
  // own running statistics, which pruning's folds and BN freezing read.
  // With modifiers this holds whatever distributed.broadcast_buffers says.
  if (ddp_ && (recipe_.distributed.broadcast_buffers || !modifiers_.empty())) ddp_->broadcast_buffers();
  at::Tensor x = batch.images.to(device_, true);
  at::Tensor y = batch.labels.to(device_, true);
  if (t.channels_last && device_.is_cuda()) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  {
    const ClearBatch clear_batch{tc_};
    tc_.input = &x;
    tc_.train_batch = [&](int64_t i) -> at::Tensor {
      if (i == 0) return x;
      at::Tensor b = train_loader_->batch(state_.epoch, (index + i) % batches).images.to(device_);
      if (t.channels_last && device_.is_cuda()) b = b.contiguous(at::MemoryFormat::ChannelsLast);
      return b;
    };
    for (auto& m : modifiers_) m->on_step_begin(tc_);
  }
  apply_parameter_changes();
  set_learning_rate(*optimizer_,
                    learning_rate_at(t.lr_schedule, t.optimizer.lr, tc_.epoch, static_cast<double>(t.epochs)));
  const bool step_now = (index + 1) % t.grad_accumulation == 0 || index + 1 == batches;
  if (ddp_) {
    // Ranks other than 0 draw from their own stream (dropout), fixed by the seed, the rank and the
    // batch, so that a resumed run draws what the uninterrupted one did.
    if (group_->rank() > 0)
      at::manual_seed(static_cast<uint64_t>(t.seed) * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(group_->rank()) * 0xBF58476D1CE4E5B9ull +
                      static_cast<uint64_t>(state_.epoch * batches + index));
    ddp_->before_forward(/*sync_gradients=*/step_now, /*with_buffers=*/false);  // broadcast above
  }
  std::vector<std::string> captures;
  for (auto& m : modifiers_)
    if (m->active_at(tc_.epoch))
      for (auto& c : m->captures()) captures.push_back(c);
  std::map<std::string, at::Tensor> features;
  at::Tensor logits;
  {
    AutocastScope autocast(autocast_, t.amp == "bf16" ? at::kBFloat16 : at::kHalf);
    if (captures.empty()) logits = model_->forward(x);
    else logits = model_->forward_with_intermediates({x}, captures, &features).at(0);
  }
  tc_.features = captures.empty() ? nullptr : &features;
  struct ClearFeatures {  // tc_.features must not outlive `features`, also when a hook throws
    TrainContext& tc;
    ~ClearFeatures() { tc.features = nullptr; }
  } clear_features{tc_};
  logits = logits.to(at::kFloat);
  at::Tensor loss = at::cross_entropy_loss(logits, y, {}, at::Reduction::Mean, -100, t.label_smoothing);
  for (auto& m : modifiers_)
    if (m->active_at(tc_.epoch)) loss = m->on_loss(tc_, loss, x, y, logits);
  const double loss_value = loss.item<double>();
  // One collective a step tells every rank both whether any rank's loss is not finite (then every
  // rank stops here, with the same message) and whether any was asked to stop (after this batch).
  bool any_not_finite = !std::isfinite(loss_value);
  if (group_) {
    const std::vector<double> flags = group_->sum({any_not_finite ? 1.0 : 0.0, g_stop.load() ? 1.0 : 0.0});
    any_not_finite = flags[0] > 0;
    stop_agreed_ = flags[1] > 0;
  }
  // Where a stopped step was, and what is kept, for the messages below.
  auto where = [&] {
    return " at step " + std::to_string(state_.step + 1) + " (epoch " + std::to_string(state_.epoch + 1) + ", batch " +
           std::to_string(index + 1) + " of " + std::to_string(batches) + "); " +
           (state_.epoch == 0 ? "nothing was saved (no epoch finished)"
                              : "the checkpoint and training state in " + result_.run_dir + " are from the end of epoch " +
                                    std::to_string(state_.epoch));
  };
  if (any_not_finite) {
    if (group_) group_->mark_failed_together();
    const std::string which = !group_ ? "" : std::isfinite(loss_value) ? " on another rank" : " on rank " + std::to_string(group_->rank());
    throw Error("training stopped: the loss is " + std::string(std::isfinite(loss_value) ? "not finite" : std::isnan(loss_value) ? "NaN" : "infinite") + which +
                where() + ". A learning rate too high for the model (training.optimizer.lr) is the usual cause");
  }
  at::Tensor scaled = scaler_.scale_loss(loss / static_cast<double>(t.grad_accumulation));
  if (ddp_) ddp_->backward(scaled);  // gradients averaged over the ranks
  else scaled.backward();
  if (step_now) {
    // A finite loss can still give a non-finite gradient (an overflow inside the backward pass); the
    // step would write NaN into the weights. With fp16 loss scaling such a step is skipped instead.
    if (!scaler_.enabled())
      if (const auto bad = find_non_finite_gradient(parameter_modules())) {
        if (group_) group_->mark_failed_together();  // the averaged gradients: every rank sees it
        throw Error("training stopped: the gradient of " + bad->parameter + " holds " + std::to_string(bad->count) +
                    " NaN or infinite value" + (bad->count == 1 ? "" : "s") + " (the loss is finite)" + where() +
                    ". A learning rate too high for the model (training.optimizer.lr) or a layer whose gradient "
                    "overflows is the cause; training.grad_clip_norm does not help (it scales a NaN)");
      }
    const std::vector<at::Tensor> params = optimized_parameters();
    if (scaler_.unscale_and_check(params)) {
      if (t.grad_clip_norm > 0) clip_gradient_norm(params, t.grad_clip_norm);
      optimizer_->step();
    }
    optimizer_->zero_grad(/*set_to_none=*/true);
    tc_.step = ++state_.step;
    if (ddp_ && recipe_.distributed.verify_every > 0 && state_.step % recipe_.distributed.verify_every == 0)
      ddp_->verify_parameters_equal("after optimizer step " + std::to_string(state_.step));
    for (auto& m : modifiers_)
      if (m->active_at(tc_.epoch)) m->on_step_end(tc_);
  }
  apply_parameter_changes();
  at::NoGradGuard g;
  state_.loss_sum += loss_value * static_cast<double>(y.size(0));
  state_.correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  state_.seen += y.size(0);
  state_.batch = index + 1;
}

bool Trainer::train_epoch() {
  const TrainingSpec& t = recipe_.training;
  const int64_t epoch = state_.epoch;
  const int64_t batches = train_loader_->num_batches();
  tc_.epoch_index = epoch;
  tc_.epoch = static_cast<double>(epoch);
  if (state_.batch == 0) {
    for (auto& m : modifiers_) m->on_epoch_begin(tc_);
    apply_parameter_changes();
  }
  model_->train();
  train_loader_->set_epoch(epoch);
  t_epoch_ = Clock::now();
  epoch_images_ = 0;
  bool stopped = false;
  train_loader_->start(state_.batch);
  while (std::optional<data::Batch> batch = train_loader_->next()) {
    const int64_t index = state_.batch;
    step(*batch);
    epoch_images_ += batch->labels.size(0);
    // Rank 0's progress stands for all ranks (they train equal shards in step).
    const double ranks = static_cast<double>(result_.world_size);
    const double rate = ranks * static_cast<double>(epoch_images_) / std::max(seconds_since(t_epoch_), 1e-9);
    progress_->update(epoch, t.epochs, index, batches, state_.loss_sum / static_cast<double>(std::max<int64_t>(state_.seen, 1)),
                      rate, ranks * static_cast<double>((batches - index - 1) * recipe_.data.batch_size) / std::max(rate, 1e-9));
    // Every rank stops at the same step: a stop request on any of them (agreed in step()) stops all.
    if (group_ ? stop_agreed_ : g_stop.load()) {
      stopped = true;
      break;
    }
  }
  progress_->end_line();
  epoch_train_seconds_ = seconds_since(t_epoch_);
  train_seconds_ += epoch_train_seconds_;
  if (state_.train_seconds >= 0) state_.train_seconds += epoch_train_seconds_;
  images_trained_ += epoch_images_;
  return !stopped;
}

EvalMetrics Trainer::evaluate() {
  if (ddp_) ddp_->broadcast_buffers();  // every rank evaluates rank 0's model, the one saved
  return runner::evaluate(model_, *test_loader_, device_, group_.get());
}

void Trainer::save_state() {
  if (!writer_) return;
  start_writing();
  save_train_state(state_path_, recipe_.text, state_, model_, modifiers_, *optimizer_, scaler_);
}

void Trainer::write_metrics_line(int64_t epoch, const std::string& line) const {
  // The file is rewritten whole (atomically): the lines of the epochs before this one, then this
  // one. A run killed after an epoch's line but before its training state repeats that epoch on
  // resume; its line then replaces the earlier one instead of appearing twice.
  const std::string path = join_path(result_.run_dir, run_files::kMetrics);
  std::string text;
  if (is_regular_file(path)) {
    std::istringstream in(read_file(path));
    for (std::string l; std::getline(in, l);) {
      const json old = json::parse(l, nullptr, false);
      if (old.is_object() && old.contains("epoch") && old["epoch"].is_number_integer() && old["epoch"].get<int64_t>() < epoch)
        text += l + "\n";
    }
  }
  text += line + "\n";
  write_file_atomic(path, text);
}

EvalMetrics Trainer::end_epoch() {
  const TrainingSpec& t = recipe_.training;
  const int64_t epoch = state_.epoch;
  if (ddp_) ddp_->broadcast_buffers();  // rank 0's running statistics for the hooks, the evaluation and the save
  for (auto& m : modifiers_) m->on_epoch_end(tc_);
  apply_parameter_changes();
  sum_epoch_over_ranks();
  const Clock::time_point t_eval = Clock::now();
  const EvalMetrics ev = runner::evaluate(model_, *test_loader_, device_, group_.get());  // buffers broadcast above
  const double eval_seconds = seconds_since(t_eval);
  if (!std::isfinite(ev.loss) && group_) group_->mark_failed_together();  // summed: every rank sees it
  if (!std::isfinite(ev.loss))
    throw Error("training stopped: after epoch " + std::to_string(epoch + 1) + " the test loss is " +
                (std::isnan(ev.loss) ? "NaN" : "infinite") + " (the model's weights are no longer finite); " +
                (epoch == 0 ? std::string("nothing was saved")
                            : "the checkpoint and training state in " + result_.run_dir + " are from epoch " +
                                  std::to_string(epoch)));
  result_.test = ev;
  tested_ = true;
  result_.epochs_done = epoch + 1;
  const double seen = static_cast<double>(state_.seen);
  json line;
  line["epoch"] = epoch + 1;
  line["train_loss"] = state_.seen ? state_.loss_sum / seen : 0.0;
  line["train_top1"] = state_.seen ? static_cast<double>(state_.correct) / seen : 0.0;
  line["test_top1"] = ev.top1;
  line["test_top5"] = ev.top5;
  line["test_loss"] = ev.loss;
  line["lr"] = learning_rate_at(t.lr_schedule, t.optimizer.lr, static_cast<double>(epoch + 1) - 1e-9,
                                static_cast<double>(t.epochs));
  const double rate = static_cast<double>(epoch_images_) / std::max(epoch_train_seconds_, 1e-9);
  line["train_images_per_second"] = rate;  // this sitting's part of the epoch
  line["train_images"] = state_.seen;
  // The whole epoch's training pass over every sitting. A state of an earlier whittle does not
  // know the seconds before its save: then this sitting's rate stands for the epoch, when it
  // trained any of it.
  if (state_.train_seconds >= 0) line["train_seconds"] = state_.train_seconds;
  else if (epoch_images_ > 0) line["train_seconds"] = seen / rate;
  line["eval_seconds"] = eval_seconds;
  {
    std::map<std::string, double> extra;
    for (auto& m : modifiers_) m->epoch_metrics(extra);
    for (const auto& [k, v] : extra) line[k] = v;
    result_.loss_terms = extra;
  }
  if (writer_) {
    start_writing();
    write_metrics_line(epoch + 1, line.dump());
  }
  *log_ << "epoch " << epoch + 1 << "/" << t.epochs << ": test top-1 " << std::fixed << std::setprecision(2)
        << 100 * ev.top1 << "%  top-5 " << 100 * ev.top5 << "%  loss " << std::setprecision(4) << ev.loss;
  for (const auto& [k, v] : result_.loss_terms) *log_ << "  " << k << " " << v;
  *log_ << "\n" << std::flush;
  TrainerState next;
  next.epoch = epoch + 1;
  next.step = state_.step;
  next.world_size = state_.world_size;
  state_ = next;
  if (writer_ && (recipe_.outputs.save_every_epoch || epoch + 1 == t.epochs)) {
    save_checkpoint(result_.checkpoint, model_->graph(), recipe_.text, line.dump());
    save_state();
  }
  return ev;
}

RunResult Trainer::run() {
  if (result_.finished_before) return result_;  // --resume of a finished run: nothing to do, nothing written
  if (recipe_.training.epochs == 0) {
    calibrate();
    return finish();
  }
  while (state_.epoch < recipe_.training.epochs) {
    if (!train_epoch()) {
      // Save where we are: the next batch of this epoch (the running sums over every rank).
      sum_epoch_over_ranks();
      if (ddp_) ddp_->broadcast_buffers();
      save_state();
      if (group_) group_->barrier();  // the others leave once the state is on disk
      *log_ << "interrupted: training state saved to " << state_path_ << " (continue with --resume)\n";
      result_.interrupted = true;
      g_stop.store(false);
      stop_agreed_ = false;
      result_.epochs_done = state_.epoch;
      result_.wall_seconds = seconds_since(t_start_);
      return result_;
    }
    end_epoch();
  }
  return finish();
}

EvalMetrics Trainer::calibrate() {
  tc_.epoch_index = 0;
  tc_.epoch = 0;
  for (auto& m : modifiers_) m->on_epoch_begin(tc_);
  apply_parameter_changes();
  const Clock::time_point t0 = Clock::now();
  const int64_t batches = train_loader_->num_batches();
  {
    at::NoGradGuard no_grad;
    model_->eval();
    at::Tensor x = train_loader_->batch(0, 0).images.to(device_);
    const ClearBatch clear_batch{tc_};
    tc_.input = &x;
    tc_.train_batch = [&](int64_t i) -> at::Tensor {
      return i == 0 ? x : train_loader_->batch(0, i % batches).images.to(device_);
    };
    for (auto& m : modifiers_) m->on_step_begin(tc_);
  }
  apply_parameter_changes();
  const double calibration_seconds = seconds_since(t0);
  const Clock::time_point t_eval = Clock::now();
  const EvalMetrics ev = evaluate();
  if (!std::isfinite(ev.loss) && group_) group_->mark_failed_together();  // summed: every rank sees it
  if (!std::isfinite(ev.loss))
    throw Error(std::string("calibration: the test loss of the calibrated model is ") + (std::isnan(ev.loss) ? "NaN" : "infinite") +
                "; nothing was saved");
  // Every rank agrees whether a Ctrl-C (or torchrun's SIGTERM) came: then nothing is written.
  if (group_ ? group_->any(g_stop.load()) : g_stop.load()) {
    g_stop.store(false);
    throw Interrupted("interrupted during calibration; nothing was written");
  }
  result_.test = ev;
  tested_ = true;
  json line;
  line["epoch"] = 0;
  line["test_top1"] = ev.top1;
  line["test_top5"] = ev.top5;
  line["test_loss"] = ev.loss;
  line["calibration_seconds"] = calibration_seconds;
  line["eval_seconds"] = seconds_since(t_eval);
  if (writer_) {
    start_writing();
    write_metrics_line(0, line.dump());
  }
  *log_ << "calibration only (training.epochs 0): test top-1 " << std::fixed << std::setprecision(2) << 100 * ev.top1
        << "%  top-5 " << 100 * ev.top5 << "%  loss " << std::setprecision(4) << ev.loss << "\n"
        << std::flush;
  return ev;
}

RunResult Trainer::finish() {
  // A resume of a run whose training was over (killed while finishing) trained no epoch in this
  // sitting: the test figures of the last epoch come from evaluating the saved model again, which
  // is the model that epoch evaluated (the state is saved after its evaluation).
  if (!tested_ && result_.epochs_done > 0) result_.test = evaluate();
  for (auto& m : modifiers_) m->on_finish(tc_);
  model_->eval();
  // The report describes the model as it is shipped (pruned, fused).
  const NodeCost cost = per_image_cost(model_->graph());
  result_.params = cost.params;
  result_.macs = cost.macs;
  json metrics;
  metrics["test_top1"] = result_.test.top1;
  metrics["test_top5"] = result_.test.top5;
  metrics["test_loss"] = result_.test.loss;
  metrics["epochs"] = result_.epochs_done;
  if (ddp_) ddp_->broadcast_buffers();
  if (!writer_) {
    group_->barrier();  // rank 0 writes the checkpoint, the exports and the report meanwhile
    return result_;
  }
  save_checkpoint(result_.checkpoint, model_->graph(), recipe_.text, metrics.dump());
  result_.checkpoint_bytes = file_size(result_.checkpoint);
  std::string export_error;
  try {
    export_final_model();
  } catch (const Error& e) {
    export_error = e.what();  // the run is complete: its report is written first
  }
  result_.wall_seconds = seconds_since(t_start_);
  // All ranks' images (they train equal shards) over rank 0's training time.
  // A sitting that only finished the run trained no images: the last epoch's rate stands for it.
  result_.train_images_per_second =
      images_trained_ > 0 ? static_cast<double>(images_trained_ * result_.world_size) / std::max(train_seconds_, 1e-9)
                          : last_epoch_rate(join_path(result_.run_dir, run_files::kMetrics));
  const std::string report_path = join_path(result_.run_dir, run_files::kReport);
  write_report(report_path, recipe_, result_, device_.str(), model_->graph());
  print_report(*log_, recipe_, result_, report_path);
  if (group_) group_->barrier();  // the run is complete on every rank, also when an export failed
  if (!export_error.empty()) throw Error(export_error);
  return result_;
}

void Trainer::export_final_model() {
  // Every format is attempted; the failures are reported together.
  std::string errors;
  for (const std::string& format : recipe_.outputs.export_formats) {
    const std::string path = join_path(result_.run_dir, export_file_name(recipe_.outputs, format));
    try {
      exporter(format).write(model_->graph(), path, export_options(format), {});
      result_.exports[format] = path;
      result_.export_bytes[format] = file_size(path);
    } catch (const Error& e) {
      errors += std::string(errors.empty() ? "" : "; ") + format + ": " + e.what();
    }
  }
  if (!errors.empty())
    throw Error("outputs.export failed (the checkpoint " + result_.checkpoint +
                " is saved; `whittle export` it once the cause is fixed): " + errors);
}

RunResult run_recipe(const Recipe& recipe, const RunOptions& options) {
  Trainer trainer(recipe, options);
  return trainer.run();
}

}  // namespace whittle::runner
