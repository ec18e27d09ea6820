// `whittle bench MODEL`: latency and throughput of the deploy runtime (deploy::Model, binary and
// bit-plane layers on the bitpacked kernels) against the float execution of the same fused model through ATen, per
// step and in total.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/file_util.h"
#include "core/shape_limits.h"
#include "deploy/model.h"
#include "kernels/isa.h"
#include "runner/model_loader.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {
namespace {

constexpr int64_t kMaxBenchThreads = 1024;  // --threads

// MemAvailable of /proc/meminfo in bytes, 0 when it cannot be read.
double memory_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// "12.3 GiB"
std::string gib(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024 * 1024) << " GiB";
  return s.str();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Wall-time samples of one model: the whole forward and each step, per run.
struct Timings {
  std::vector<double> total;
  std::vector<std::vector<double>> steps;  // [run][step]
};

void time_once(const deploy::Model& model, const at::Tensor& x, Timings& t) {
  std::vector<double> steps;
  const auto t0 = std::chrono::steady_clock::now();
  model.forward({x}, &steps);
  t.total.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  t.steps.push_back(std::move(steps));
}

double step_median(const Timings& t, size_t step) {
  std::vector<double> v;
  for (const auto& run : t.steps) v.push_back(run[step]);
  return median(v);
}

std::string join_nodes(const std::vector<std::string>& nodes) {
  std::string s;
  for (const auto& n : nodes) s += (s.empty() ? "" : " + ") + n;
  return s;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle bench MODEL [--batch N] [--threads T] [--repeat R] [--input-shape N,C,H,W] [--back-to-back]\n"
      "                     [--json]\n\n"
      "Times the deploy runtime (binary and bit-plane layers on the bitpacked kernels, int8 layers on\n"
      "whittle's int8 kernels; docs/kernels.md) against the float execution of the same fused model\n"
      "through ATen (oneDNN), per step and in total, on a\n"
      "random input of the model's input shape. Runs alternate between the two (each starts on caches\n"
      "the other left), or with --back-to-back each model's runs follow one another (warm caches, as\n"
      "ONNX Runtime's timings of repeated runs are); medians are given.\n"
      "Both run the same fused, packed graph, so their outputs agree to float rounding (printed; int8\n"
      "layers requantize in integer arithmetic, so a code may land one level apart).\n"
      "MODEL is a whittle checkpoint (.h5), a zoo model name or a TorchScript file (.pt); zoo and\n"
      "TorchScript models are float, so only a quantized checkpoint has layers on the packed kernels.\n"
      "--json prints: model, batch, threads, isa, repeat, back_to_back, packed_layers, int8_steps, steps [{nodes, kernel,\n"
      "deploy_ms, float_ms}], deploy_ms, float_ms, speedup, deploy_images_per_s, float_images_per_s,\n"
      "max_relative_difference.\n\n"
      "example:\n  whittle bench runs/mnist/lenet5_bnn/model.h5 --batch 1 --threads 1\n\noptions");
  std::string model_spec, shape_text;
  int64_t batch = 1, threads = 0, repeat = 20;
  opts.add_options()("help,h", "this text")("batch", po::value<int64_t>(&batch)->default_value(1), "batch size")(
      "threads", po::value<int64_t>(&threads)->default_value(0), "intra-op threads (0: LibTorch's default)")(
      "repeat", po::value<int64_t>(&repeat)->default_value(20), "timed runs of each model (after 3 warm-up runs)")(
      "input-shape", po::value<std::string>(&shape_text), "input shape of a TorchScript file or zoo model, comma-separated (the batch comes from --batch)")(
      "back-to-back", "time all runs of the deploy runtime, then all of the float execution, rather than alternating")(
      "json", "print JSON");
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model_spec}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (model_spec.empty()) throw Error("bench: missing MODEL (see whittle bench --help)", ErrorKind::kUsage);
  if (batch < 1) throw Error("bench: --batch must be ≥ 1, got " + std::to_string(batch), ErrorKind::kUsage);
  // Thousands of threads only measure the scheduler (and take minutes to start); an int64 past
  // int's range would be cut to another count.
  if (threads < 0 || threads > kMaxBenchThreads)
    throw Error("bench: --threads must be in 0.." + std::to_string(kMaxBenchThreads) + " (0: LibTorch's default), got " +
                    std::to_string(threads),
                ErrorKind::kUsage);
  if (repeat < 1) throw Error("bench: --repeat must be ≥ 1, got " + std::to_string(repeat), ErrorKind::kUsage);
  std::optional<Shape> shape;
  if (vm.count("input-shape") && shape_text.empty()) throw Error("bench: --input-shape is empty", ErrorKind::kUsage);
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  const runner::ModelSource source = model_source(model_spec, shape, 10);
  if (shape && !source.file.empty() && is_hdf5_file(source.file))
    throw Error("bench: --input-shape applies to TorchScript files and zoo models; a checkpoint keeps the input shape "
                "it was trained with (the batch comes from --batch)",
                ErrorKind::kUsage);
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && threads > static_cast<int64_t>(cores))
    std::cerr << "whittle bench: note: --threads " << threads << " is more than the " << cores
              << " cores here; the timings will mostly measure contention\n";
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));

  const Graph graph = runner::load_model(source);
  if (graph.inputs().size() != 1 || graph.outputs().size() != 1)
    throw Error("bench: " + model_spec + " has " + std::to_string(graph.inputs().size()) + " inputs and " +
                std::to_string(graph.outputs().size()) + " outputs; bench takes single-input, single-output models");
  const deploy::Model fast(graph);
  const deploy::Model reference(graph, deploy::Options{false});
  Shape input_shape = graph.value(graph.inputs().front()).shape;
  if (input_shape.empty())
    throw Error("bench: " + model_spec + " declares a scalar input; give --input-shape", ErrorKind::kUsage);
  input_shape[0] = batch;
  if (!shape_within_limit(input_shape))
    throw Error("bench: --batch " + std::to_string(batch) + " makes the input " + shape_str(input_shape) +
                    ", more than 2^40 elements",
                ErrorKind::kUsage);
  // The largest activation, twice (a step's input and output), is the least a forward pass holds;
  // a batch for which even that does not fit the memory available is refused, not swapped for minutes.
  double largest = 0;  // float32 values per image
  for (const Node& n : graph.nodes())
    for (const auto& v : n.outputs) {
      const Shape& s = graph.value(v).shape;
      if (s.empty() || s[0] < 1) continue;
      double per_image = 1;
      for (size_t d = 1; d < s.size(); ++d) per_image *= static_cast<double>(s[d]);
      largest = std::max(largest, per_image);
    }
  const double need = 2 * largest * static_cast<double>(batch) * 4;
  const double available = memory_available_bytes();
  if (available > 0 && need > available)
    throw Error("bench: --batch " + std::to_string(batch) + " needs at least " + gib(need) + " for " + model_spec +
                    "'s activations, more than the " + gib(available) + " of memory available; give a smaller --batch",
                ErrorKind::kUsage);
  at::manual_seed(0);
  const at::Tensor x = at::randn(input_shape);

  // Same outputs (to float rounding of the folded BN and the threshold).
  const auto t_first = std::chrono::steady_clock::now();
  const at::Tensor y_fast = fast.forward(x), y_ref = reference.forward(x);
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_first).count();
  if (first_s > 2)  // a long run says so rather than printing nothing for minutes
    std::cerr << "whittle bench: one pass of both runtimes took " << std::fixed << std::setprecision(1) << first_s
              << " s; " << 3 + repeat << " more (3 warm-up, --repeat " << repeat << ") take about "
              << first_s * static_cast<double>(3 + repeat) << " s\n"
              << std::defaultfloat;
  const double ref_scale = std::max(1e-30, y_ref.abs().max().item<double>());
  const double max_rel = (y_fast - y_ref).abs().max().item<double>() / ref_scale;

  Timings tf, tr;
  for (int i = 0; i < 3; ++i) {
    fast.forward(x);
    reference.forward(x);
  }
  if (vm.count("back-to-back")) {
    for (int64_t i = 0; i < repeat; ++i) time_once(fast, x, tf);
    for (int64_t i = 0; i < repeat; ++i) time_once(reference, x, tr);
  } else {
    for (int64_t i = 0; i < repeat; ++i) {
      time_once(fast, x, tf);
      time_once(reference, x, tr);
    }
  }

  // Float time of each deploy step: the reference steps (one node each) of the same nodes.
  std::map<std::string, size_t> ref_step_of;
  const std::vector<deploy::StepInfo> ref_steps = reference.steps(), fast_steps = fast.steps();
  for (size_t i = 0; i < ref_steps.size(); ++i)
    for (const auto& n : ref_steps[i].nodes) ref_step_of[n] = i;
  struct Row {
    std::string nodes, kernel;
    double deploy_ms, float_ms;
  };
  std::vector<Row> rows;
  for (size_t i = 0; i < fast_steps.size(); ++i) {
    double float_s = 0;
    for (const auto& n : fast_steps[i].nodes) float_s += step_median(tr, ref_step_of.at(n));
    rows.push_back({join_nodes(fast_steps[i].nodes), fast_steps[i].kernel, 1e3 * step_median(tf, i), 1e3 * float_s});
  }
  const double deploy_ms = 1e3 * median(tf.total), float_ms = 1e3 * median(tr.total);
  const std::string isa = kernels::isa_name(kernels::active_isa());
  const int num_threads = at::get_num_threads();
  int64_t int8_steps = 0;  // steps on integer kernels (deploy/int8.h)
  for (const Row& r : rows) int8_steps += r.kernel.rfind("int8 ", 0) == 0;

  if (vm.count("json")) {
    nlohmann::ordered_json j{{"model", model_spec}, {"batch", batch}, {"threads", num_threads}, {"isa", isa},
                             {"repeat", repeat}, {"back_to_back", vm.count("back-to-back") > 0}, {"packed_layers", fast.num_packed_layers()}, {"int8_steps", int8_steps}};
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const Row& r : rows)
      steps.push_back({{"nodes", r.nodes}, {"kernel", r.kernel}, {"deploy_ms", r.deploy_ms}, {"float_ms", r.float_ms}});
    j["steps"] = steps;
    j["deploy_ms"] = deploy_ms;
    j["float_ms"] = float_ms;
    j["speedup"] = float_ms / deploy_ms;
    j["deploy_images_per_s"] = 1e3 * static_cast<double>(batch) / deploy_ms;
    j["float_images_per_s"] = 1e3 * static_cast<double>(batch) / float_ms;
    j["max_relative_difference"] = max_rel;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "whittle bench " << model_spec << ": batch " << batch << ", " << num_threads << " thread"
            << (num_threads == 1 ? "" : "s") << ", " << isa << " popcount kernels, " << fast.num_packed_layers()
            << " layers on packed kernels, " << int8_steps << " int8 step" << (int8_steps == 1 ? "" : "s") << "; medians of " << repeat << " run" << (repeat == 1 ? "" : "s") << "\n\n";
  size_t wn = 4, wk = 6;
  for (const Row& r : rows) {
    wn = std::max(wn, r.nodes.size());
    wk = std::max(wk, r.kernel.size());
  }
  std::cout << std::left << std::setw(static_cast<int>(wn) + 2) << "step" << std::setw(static_cast<int>(wk) + 2)
            << "kernel" << std::right << std::setw(11) << "deploy ms" << std::setw(11) << "float ms" << std::setw(10)
            << "speed-up" << "\n";
  std::cout << std::fixed;
  for (const Row& r : rows)
    std::cout << std::left << std::setw(static_cast<int>(wn) + 2) << r.nodes << std::setw(static_cast<int>(wk) + 2)
              << r.kernel << std::right << std::setprecision(3) << std::setw(11) << r.deploy_ms << std::setw(11)
              << r.float_ms << std::setprecision(2) << std::setw(9) << r.float_ms / std::max(1e-9, r.deploy_ms) << "x\n";
  std::cout << std::left << std::setw(static_cast<int>(wn + wk) + 4) << "total (whole forward)" << std::right
            << std::setprecision(3) << std::setw(11) << deploy_ms << std::setw(11) << float_ms << std::setprecision(2)
            << std::setw(9) << float_ms / deploy_ms << "x\n\n";
  std::cout << std::setprecision(0) << "throughput: deploy " << 1e3 * static_cast<double>(batch) / deploy_ms
            << " images/s, float " << 1e3 * static_cast<double>(batch) / float_ms << " images/s\n";
  std::cout << std::scientific << std::setprecision(1) << "outputs: max |deploy - float| / max |float| = " << max_rel
            << "\n";
  return 0;
}

}  // namespace whittle::cli
