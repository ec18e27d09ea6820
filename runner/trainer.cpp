#include "runner/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "data/hdf5_dataset.h"
#include "data/image_archive.h"
#include "data/load.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "core/error.h"
#include "core/file_util.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
#include "graph/torchscript_import.h"
#include "graph/version.h"
#include "graph/zoo.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

std::atomic<bool> g_stop{false};
constexpr double kPi = 3.14159265358979323846;
using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---------------------------------------------------------------- data

data::Dataset load_limited(const DataSpec& spec, const std::string& path, const std::string& split, int64_t limit,
                           std::ostream& log) {
  data::Dataset ds = load_split(path, split, spec.pack_to, log);
  if (limit > 0 && limit < ds.size()) ds = ds.subset(at::arange(limit, at::kLong));
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

// ---------------------------------------------------------------- optimizer

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& o, const std::vector<at::Tensor>& params) {
  if (o.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
  }
  if (o.name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  }
  if (o.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  }
  throw Error("unknown optimizer '" + o.name + "' (sgd, adam, adamw)", ErrorKind::kUsage);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

std::vector<at::Tensor> trainable(GraphModule& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// ---------------------------------------------------------------- model

Graph build_graph(const Recipe& r, const data::Dataset& train) {
  const ModelSpec& m = r.model;
  Shape input = m.input_shape.empty() ? Shape{1, train.channels(), train.height(), train.width()} : m.input_shape;
  if (!m.file.empty()) {
    const std::string ext = file_extension(m.file);
    if (ext == ".h5" || ext == ".hdf5") return load_checkpoint(m.file).graph;
    return import_torchscript(m.file, input);
  }
  ZooOptions z;
  z.num_classes = m.num_classes;
  z.input_shape = input;
  z.seed = static_cast<uint64_t>(r.training.seed);
  return build_model(m.name, z);
}

// ---------------------------------------------------------------- training state

void save_state(const std::string& path, GraphModule& model, torch::optim::Optimizer& opt, int64_t epoch,
                int64_t batch, int64_t step) {
  torch::serialize::OutputArchive a;
  a.write("format", at::tensor(int64_t{1}));
  a.write("epoch", at::tensor(epoch));
  a.write("batch", at::tensor(batch));
  a.write("step", at::tensor(step));
  const std::string structure = graph_to_json(model->graph());
  a.write("graph", at::from_blob(const_cast<char*>(structure.data()), {static_cast<int64_t>(structure.size())}, at::kByte).clone());
  torch::serialize::OutputArchive tensors;
  for (const auto& p : model->named_parameters()) tensors.write(p.key(), p.value().detach().cpu());
  for (const auto& b : model->named_buffers()) tensors.write(b.key(), b.value().detach().cpu(), /*is_buffer=*/true);
  a.write("tensors", tensors);
  torch::serialize::OutputArchive optim;
  opt.save(optim);
  a.write("optimizer", optim);
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    a.write("cpu_rng", gen.get_state());
  }
  try {
    write_atomic(path, [&](const std::string& tmp) { a.save_to(tmp); });
  } catch (const std::exception& e) {
    throw Error("cannot write training state " + path + ": " + e.what());
  }
}

struct LoadedState {
  int64_t epoch = 0, batch = 0, step = 0;
};

LoadedState load_state(const std::string& path, GraphModule& model, torch::optim::Optimizer& opt) {
  if (!is_regular_file(path)) throw Error("--resume: no training state at " + path + " (nothing to resume)");
  torch::serialize::InputArchive a;
  try {
    a.load_from(path);
  } catch (const std::exception& e) {
    throw Error("--resume: " + path + " is not a readable training state (truncated or damaged): " + e.what());
  }
  auto read_int = [&](const char* k) {
    at::Tensor t;
    if (!a.try_read(k, t)) throw Error("--resume: " + path + " lacks '" + k + "'");
    return t.item<int64_t>();
  };
  LoadedState s{read_int("epoch"), read_int("batch"), read_int("step")};
  at::Tensor structure;
  a.read("graph", structure);
  const std::string saved(static_cast<const char*>(structure.data_ptr()), static_cast<size_t>(structure.numel()));
  if (saved != graph_to_json(model->graph()))
    throw Error("--resume: the model in " + path + " differs from the one this recipe builds (changed recipe?)");
  torch::serialize::InputArchive tensors;
  a.read("tensors", tensors);
  at::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    at::Tensor t;
    if (!tensors.try_read(p.key(), t)) throw Error("--resume: " + path + " lacks tensor " + p.key());
    p.value().copy_(t);
  }
  for (auto& b : model->named_buffers()) {
    at::Tensor t;
    if (!tensors.try_read(b.key(), t, /*is_buffer=*/true)) throw Error("--resume: " + path + " lacks buffer " + b.key());
    b.value().copy_(t);
  }
  torch::serialize::InputArchive optim;
  a.read("optimizer", optim);
  opt.load(optim);
  at::Tensor rng;
  a.read("cpu_rng", rng);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
  return s;
}

// ---------------------------------------------------------------- progress

class Progress {
 public:
  Progress(std::ostream& os, bool tty, int64_t log_every) : os_(os), tty_(tty), log_every_(log_every) {}
  void update(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double loss, double images_per_s,
              double eta_s) {
    if (!tty_ && (log_every_ <= 0 || (batch + 1) % log_every_ != 0) && batch + 1 != batches) return;
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << epochs << "  ";
    if (tty_) {
      const int width = 24;
      int filled = static_cast<int>(width * (batch + 1) / std::max<int64_t>(batches, 1));
      line << "[" << std::string(static_cast<size_t>(filled), '#') << std::string(static_cast<size_t>(width - filled), '.') << "] ";
    }
    line << batch + 1 << "/" << batches << "  loss " << std::fixed << std::setprecision(4) << loss << "  "
         << std::setprecision(0) << images_per_s << " img/s  ETA " << format_eta(eta_s);
    if (tty_) os_ << "\r" << line.str() << "\033[K" << std::flush;
    else os_ << line.str() << "\n" << std::flush;
  }
  void end_line() {
    if (tty_) os_ << "\n";
  }
  static std::string format_eta(double s) {
    int64_t t = static_cast<int64_t>(std::max(0.0, s));
    std::ostringstream o;
    o << t / 60 << ":" << std::setw(2) << std::setfill('0') << t % 60;
    return o.str();
  }

 private:
  std::ostream& os_;
  bool tty_;
  int64_t log_every_;
};

// Dynamic loss scaling for fp16 autocast: scale the loss, unscale gradients, skip steps with
// non-finite gradients and halve the scale; double it after 2000 clean steps.
struct LossScaler {
  bool enabled = false;
  double scale = 65536.0;
  int64_t clean_steps = 0;
  bool unscale_and_check(const std::vector<at::Tensor>& params) {
    if (!enabled) return true;
    bool finite = true;
    at::NoGradGuard g;
    for (const auto& p : params) {
      if (!p.grad().defined()) continue;
      p.grad().mul_(1.0 / scale);
      if (!at::isfinite(p.grad()).all().item<bool>()) finite = false;
    }
    if (!finite) {
      scale /= 2;
      clean_steps = 0;
    } else if (++clean_steps >= 2000) {
      scale *= 2;
      clean_steps = 0;
    }
    return finite;
  }
};

}  // namespace

void request_stop() noexcept { g_stop.store(true); }

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    if (g_stop.load()) std::_Exit(130);  // second Ctrl-C: leave at once
    request_stop();
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

double learning_rate_at(const ScheduleSpec& s, double lr, double e, double total) {
  double rate = lr;
  if (s.name == "constant") {
    rate = lr;
  } else if (s.name == "step") {
    rate = lr * std::pow(s.gamma, std::floor(e / s.step_size));
  } else if (s.name == "multistep") {
    int passed = 0;
    for (double m : s.milestones) passed += e >= m ? 1 : 0;
    rate = lr * std::pow(s.gamma, passed);
  } else if (s.name == "cosine") {
    double f = std::min(1.0, std::max(0.0, e / total));
    rate = s.min_lr + (lr - s.min_lr) * 0.5 * (1 + std::cos(kPi * f));
  } else if (s.name == "one_cycle") {
    const double peak = s.max_lr > 0 ? s.max_lr : lr;
    const double start = peak / 25.0, end = peak / 1e4;
    const double f = std::min(1.0, std::max(0.0, e / total));
    if (f < s.pct_start) {
      double p = f / s.pct_start;
      rate = peak + (start - peak) * 0.5 * (1 + std::cos(kPi * p));
    } else {
      double p = (f - s.pct_start) / std::max(1e-12, 1 - s.pct_start);
      rate = end + (peak - end) * 0.5 * (1 + std::cos(kPi * p));
    }
  } else {
    throw Error("unknown lr_schedule '" + s.name + "'", ErrorKind::kUsage);
  }
  if (s.warmup_epochs > 0 && e < s.warmup_epochs) rate *= e / s.warmup_epochs;
  return rate;
}

EvalMetrics evaluate(GraphModule& model, data::DataLoader& loader, const at::Device& device) {
  model->eval();
  at::NoGradGuard no_grad;
  EvalMetrics m;
  double loss_sum = 0;
  int64_t c1 = 0, c5 = 0;
  for (auto& batch : loader) {
    at::Tensor x = batch.images.to(device, /*non_blocking=*/true);
    at::Tensor y = batch.labels.to(device, true);
    at::Tensor logits = model->forward(x).to(at::kFloat);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    at::Tensor top = std::get<1>(logits.topk(k, 1));
    at::Tensor hit = top.eq(y.unsqueeze(1));
    c1 += hit.select(1, 0).sum().item<int64_t>();
    c5 += hit.any(1).sum().item<int64_t>();
    m.samples += y.size(0);
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
  if (!is_device_name(name))
    throw Error("device '" + name + "': expected cpu, cuda or cuda:N", ErrorKind::kUsage);
  const at::Device device(name);
  if (!device.is_cuda()) return device;
  if (!at::hasCUDA())
    throw Error("device '" + name + "' requested but no CUDA device is available", ErrorKind::kUsage);
  const auto count = static_cast<int64_t>(at::getNumGPUs());
  if (device.has_index() && device.index() >= count)
    throw Error("device '" + name + "' requested but LibTorch sees " + std::to_string(count) + " CUDA device(s)",
                ErrorKind::kUsage);
  return device;
}

RunResult run_recipe(const Recipe& r, const RunOptions& options) {
  std::ostream& log = options.log ? *options.log : std::cout;
  const auto t_start = Clock::now();
  g_stop.store(false);
  RunResult result;
  result.run_dir = options.out_dir.empty() ? r.outputs.dir : options.out_dir;
  const std::string& dir = result.run_dir;
  result.checkpoint = join_path(dir, r.outputs.checkpoint);
  const std::string state_path = join_path(dir, "train_state.pt");

  // The run directory must be writable before any work starts.
  try {
    make_directories(dir);
    write_file_atomic(join_path(dir, ".write-test"), "ok");
    remove_file(join_path(dir, ".write-test"));
  } catch (const Error& e) {
    throw Error("output directory " + dir + " cannot be written: " + e.what());
  }

  const TrainingSpec& t = r.training;
  const std::string device_name = options.device.empty() ? t.device : options.device;
  const at::Device device = open_device(device_name);
  if (t.threads > 0) at::set_num_threads(static_cast<int>(t.threads));
  at::manual_seed(static_cast<uint64_t>(t.seed));
  auto& ctx = at::globalContext();
  if (t.deterministic) ctx.setDeterministicAlgorithms(true, false);
  if (device.is_cuda()) {
    ctx.setBenchmarkCuDNN(t.cudnn_benchmark && !t.deterministic);
    ctx.setDeterministicCuDNN(t.deterministic);
  }

  // Data.
  data::Dataset train = load_limited(r.data, r.data.train, r.data.train_split, r.data.train_limit, log);
  data::Dataset test = load_limited(r.data, r.data.test, r.data.test_split, r.data.test_limit, log);
  data::LoaderOptions train_opts;
  train_opts.batch_size = r.data.batch_size;
  train_opts.shuffle = true;
  train_opts.drop_last = r.data.drop_last;
  train_opts.seed = static_cast<uint64_t>(t.seed);
  train_opts.num_workers = static_cast<int>(r.data.num_workers);
  train_opts.prefetch_batches = static_cast<int>(r.data.prefetch);
  train_opts.pin_memory = device.is_cuda();
  train_opts.transform = make_transform(r.data, true);
  data::LoaderOptions test_opts = train_opts;
  test_opts.batch_size = r.data.eval_batch_size;
  test_opts.shuffle = false;
  test_opts.drop_last = false;
  test_opts.transform = make_transform(r.data, false);
  data::DataLoader train_loader(std::move(train), train_opts);
  data::DataLoader test_loader(std::move(test), test_opts);

  // Model, modifiers, optimizer.
  GraphModule model(build_graph(r, train_loader.dataset()));
  model->to(device);
  std::vector<std::unique_ptr<Modifier>> modifiers;
  for (const auto& spec : r.modifiers) modifiers.push_back(modifier_info(spec.name).create(spec));
  TrainContext tc;
  tc.model = model;
  tc.recipe = &r;
  for (auto& m : modifiers) m->on_start(tc);
  if (tc.parameters_changed) model->to(device);
  tc.parameters_changed = false;
  std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(t.optimizer, trainable(model));
  tc.optimizer = optimizer.get();
  if (t.channels_last && device.is_cuda()) {
    at::NoGradGuard g;
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }

  int64_t start_epoch = 0, start_batch = 0;
  if (options.resume) {
    LoadedState s = load_state(state_path, model, *optimizer);
    start_epoch = s.epoch;
    start_batch = s.batch;
    tc.step = s.step;
    log << "resuming " << dir << " at epoch " << start_epoch + 1 << ", batch " << start_batch << "\n";
  }
  write_file_atomic(join_path(dir, "recipe.yaml"), r.text);
  if (!options.resume) write_file_atomic(join_path(dir, "metrics.jsonl"), "");

  const NodeCost cost = [&] {
    NodeCost c = graph_cost(model->graph());
    const Shape in = model->graph().value(model->graph().inputs().front()).shape;
    if (!in.empty() && in[0] > 1) c.macs /= in[0];
    return c;
  }();
  result.params = cost.params;
  result.macs = cost.macs;
  log << "model " << (r.model.name.empty() ? r.model.file : r.model.name) << ": " << cost.params << " parameters, "
      << cost.macs << " MACs/image; data: " << train_loader.num_samples() << " train / "
      << test_loader.num_samples() << " test images; device " << device.str() << "\n" << std::flush;

  const bool tty = &log == &std::cout && ::isatty(STDOUT_FILENO);
  Progress progress(log, tty, t.log_every);
  LossScaler scaler;
  scaler.enabled = device.is_cuda() && t.amp == "fp16";
  const bool autocast = device.is_cuda() && t.amp != "none";
  const int64_t batches = train_loader.num_batches();
  const double total_epochs = static_cast<double>(t.epochs);
  int64_t images_trained = 0;
  double train_seconds = 0;

  for (int64_t epoch = start_epoch; epoch < t.epochs; ++epoch) {
    tc.epoch_index = epoch;
    tc.epoch = static_cast<double>(epoch);
    for (auto& m : modifiers) m->on_epoch_begin(tc);
    if (tc.parameters_changed) {
      model->to(device);
      optimizer = make_optimizer(t.optimizer, trainable(model));
      tc.optimizer = optimizer.get();
      tc.parameters_changed = false;
    }
    model->train();
    train_loader.set_epoch(epoch);
    const auto t_epoch = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    const int64_t first = epoch == start_epoch ? start_batch : 0;
    auto run_batch = [&](const data::Batch& batch, int64_t index) {
      tc.epoch = static_cast<double>(epoch) + static_cast<double>(index) / static_cast<double>(batches);
      set_lr(*optimizer, learning_rate_at(t.lr_schedule, t.optimizer.lr, tc.epoch, total_epochs));
      at::Tensor x = batch.images.to(device, true);
      at::Tensor y = batch.labels.to(device, true);
      if (t.channels_last && device.is_cuda()) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      at::Tensor logits, loss;
      {
        if (autocast) {
          at::autocast::set_autocast_enabled(at::kCUDA, true);
          at::autocast::set_autocast_dtype(at::kCUDA, t.amp == "bf16" ? at::kBFloat16 : at::kHalf);
        }
        logits = model->forward(x);
        if (autocast) {
          at::autocast::set_autocast_enabled(at::kCUDA, false);
          at::autocast::clear_cache();
        }
      }
      logits = logits.to(at::kFloat);
      loss = at::cross_entropy_loss(logits, y, {}, at::Reduction::Mean, -100, t.label_smoothing);
      for (auto& m : modifiers)
        if (m->active_at(tc.epoch)) loss = m->on_loss(tc, loss, x, y, logits);
      at::Tensor scaled = loss / static_cast<double>(t.grad_accumulation);
      if (scaler.enabled) scaled = scaled * scaler.scale;
      scaled.backward();
      if ((index + 1) % t.grad_accumulation == 0 || index + 1 == batches) {
        auto params = trainable(model);
        bool ok = scaler.unscale_and_check(params);
        if (ok) {
          if (t.grad_clip_norm > 0) {
            std::vector<at::Tensor> grads;
            for (auto& p : params)
              if (p.grad().defined()) grads.push_back(p.grad());
            at::NoGradGuard g;
            double total = 0;
            for (auto& gr : grads) total += gr.pow(2).sum().item<double>();
            total = std::sqrt(total);
            if (total > t.grad_clip_norm)
              for (auto& gr : grads) gr.mul_(t.grad_clip_norm / (total + 1e-6));
          }
          optimizer->step();
        }
        optimizer->zero_grad(/*set_to_none=*/true);
        ++tc.step;
        for (auto& m : modifiers)
          if (m->active_at(tc.epoch)) m->on_step_end(tc);
      }
      at::NoGradGuard g;
      loss_sum += loss.item<double>() * static_cast<double>(y.size(0));
      correct += logits.argmax(1).eq(y).sum().item<int64_t>();
      seen += y.size(0);
      const double el = seconds_since(t_epoch);
      const double rate = static_cast<double>(seen) / std::max(el, 1e-9);
      progress.update(epoch, t.epochs, index, batches, loss_sum / static_cast<double>(seen), rate,
                      static_cast<double>((batches - index - 1) * r.data.batch_size) / std::max(rate, 1e-9));
    };
    int64_t index = first;
    bool stopped = false;
    if (first > 0) {
      for (; index < batches && !g_stop.load(); ++index) run_batch(train_loader.batch(epoch, index), index);
    } else {
      for (auto& batch : train_loader) {
        run_batch(batch, index);
        ++index;
        if (g_stop.load()) break;
      }
    }
    progress.end_line();
    train_seconds += seconds_since(t_epoch);
    images_trained += seen;
    if (g_stop.load() && index < batches) stopped = true;
    if (stopped || (g_stop.load() && index >= batches)) {
      // Save where we are: the next batch of this epoch (or the next epoch when it just ended).
      const bool epoch_done = index >= batches;
      save_state(state_path, model, *optimizer, epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : index, tc.step);
      log << "interrupted: training state saved to " << state_path << " (continue with --resume)\n";
      result.interrupted = true;
      result.epochs_done = epoch_done ? epoch + 1 : epoch;
      result.wall_seconds = seconds_since(t_start);
      return result;
    }

    for (auto& m : modifiers) m->on_epoch_end(tc);
    EvalMetrics ev = evaluate(model, test_loader, device);
    result.test = ev;
    result.epochs_done = epoch + 1;
    json line;
    line["epoch"] = epoch + 1;
    line["train_loss"] = seen ? loss_sum / static_cast<double>(seen) : 0.0;
    line["train_top1"] = seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
    line["test_top1"] = ev.top1;
    line["test_top5"] = ev.top5;
    line["test_loss"] = ev.loss;
    line["lr"] = learning_rate_at(t.lr_schedule, t.optimizer.lr, static_cast<double>(epoch + 1) - 1e-9, total_epochs);
    line["train_images_per_second"] = seen / std::max(seconds_since(t_epoch), 1e-9);
    {
      std::ofstream f(join_path(dir, "metrics.jsonl"), std::ios::app);
      f << line.dump() << "\n";
    }
    log << "epoch " << epoch + 1 << "/" << t.epochs << ": test top-1 " << std::fixed << std::setprecision(2)
        << 100 * ev.top1 << "%  top-5 " << 100 * ev.top5 << "%  loss " << std::setprecision(4) << ev.loss << "\n"
        << std::flush;
    if (r.outputs.save_every_epoch || epoch + 1 == t.epochs) {
      save_checkpoint(result.checkpoint, model->graph(), r.text, line.dump());
      save_state(state_path, model, *optimizer, epoch + 1, 0, tc.step);
    }
  }

  for (auto& m : modifiers) m->on_finish(tc);
  model->eval();
  json metrics;
  metrics["test_top1"] = result.test.top1;
  metrics["test_top5"] = result.test.top5;
  metrics["test_loss"] = result.test.loss;
  metrics["epochs"] = result.epochs_done;
  save_checkpoint(result.checkpoint, model->graph(), r.text, metrics.dump());
  result.checkpoint_bytes = file_size(result.checkpoint);
  result.wall_seconds = seconds_since(t_start);
  result.train_images_per_second = static_cast<double>(images_trained) / std::max(train_seconds, 1e-9);

  json report;
  report["recipe"] = r.path;
  report["model"] = r.model.name.empty() ? r.model.file : r.model.name;
  report["test_top1"] = result.test.top1;
  report["test_top5"] = result.test.top5;
  report["test_loss"] = result.test.loss;
  report["test_images"] = result.test.samples;
  report["epochs"] = result.epochs_done;
  report["params"] = result.params;
  report["macs_per_image"] = result.macs;
  report["checkpoint"] = result.checkpoint;
  report["checkpoint_bytes"] = result.checkpoint_bytes;
  report["wall_seconds"] = result.wall_seconds;
  report["train_images_per_second"] = result.train_images_per_second;
  report["device"] = device.str();
  // Float results depend on these (docs/reproducibility.md).
  report["cpu_capability"] = cpu_capability();
  report["intra_op_threads"] = intra_op_threads();
  report["seed"] = t.seed;
  report["deterministic"] = t.deterministic;
  report["torch_version"] = torch_version();
  write_file_atomic(join_path(dir, "report.json"), report.dump(2) + "\n");

  log << "\n"
      << "  result                 " << (r.model.name.empty() ? r.model.file : r.model.name) << "\n"
      << "  test top-1             " << std::fixed << std::setprecision(2) << 100 * result.test.top1 << " %\n"
      << "  test top-5             " << 100 * result.test.top5 << " %\n"
      << "  test loss              " << std::setprecision(4) << result.test.loss << "\n"
      << "  parameters             " << result.params << "\n"
      << "  MACs per image         " << result.macs << "\n"
      << "  checkpoint             " << result.checkpoint << " (" << result.checkpoint_bytes << " bytes)\n"
      << "  wall time              " << std::setprecision(1) << result.wall_seconds << " s\n"
      << "  training speed         " << std::setprecision(0) << result.train_images_per_second << " images/s\n"
      << "  report                 " << join_path(dir, "report.json") << "\n";
  return result;
}

}  // namespace whittle::runner
