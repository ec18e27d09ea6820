#include "deploy/model.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <set>

#include "core/error.h"
#include "deploy/lowering.h"
#include "export/checkpoint.h"
#include "export/deploy.h"
#include "fuse/fuse.h"
#include "graph/op_registry.h"
#include "kernels/isa.h"
#include "quantize/quantize.h"

namespace whittle::deploy {

struct Model::Plan {
  Graph graph;
  std::vector<Step> steps;
  std::vector<size_t> input_slots, output_slots;
  std::vector<std::vector<size_t>> release;  // per step: slots whose last use it is
  size_t num_slots = 0;
};

namespace {

// The fused, packed deploy form of `graph`, its tensors on the CPU (a graph trained on CUDA
// included: the runtime runs on the CPU).
Graph deploy_form(const Graph& graph) {
  Graph g = deploy_graph(graph);
  for (Node& n : g.nodes()) {
    for (auto& [name, t] : n.params)
      if (t.defined() && !t.is_cpu()) t = t.cpu();
    for (auto& [name, t] : n.buffers)
      if (t.defined() && !t.is_cpu()) t = t.cpu();
  }
  fuse::fuse_for_inference(g);
  return quantize::pack_graph(g);
}

// An error of a hook (while the plan is built) or of a step (while it runs) as a whittle::Error
// naming `where` ("node 'conv2' (conv2d)"), unless it names a node already; ATen's message
// without its C++ backtrace.
[[noreturn]] void rethrow_at(const std::string& where, const std::exception& e, ErrorKind kind = ErrorKind::kRuntime) {
  std::string msg = e.what();
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) msg = c->what_without_backtrace();
  if (const size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  if (msg.rfind("node '", 0) == 0) throw Error(msg, kind);
  throw Error(where + ": " + msg, kind);
}

// "node 'conv2' + 'bn2' (binary_conv2d + threshold)": a step in error messages.
std::string step_name(const Step& s) {
  std::string names;
  for (const std::string& n : s.nodes) names += (names.empty() ? "'" : " + '") + n + "'";
  return "node " + names + " (" + s.kernel + ")";
}

}  // namespace

Model::Model(const Graph& graph, const Options& options) {
  register_all();
  // The kernels' instruction set (cpuid, or WHITTLE_KERNEL_ISA) is settled before any step: a bad
  // setting is reported as itself, not as the first binary layer's failure.
  if (options.use_kernels) kernels::active_isa();
  auto plan = std::make_shared<Plan>();
  plan->graph = deploy_form(graph);
  const Graph& g = plan->graph;
  Lowering lowering(g, options.use_kernels);
  for (const std::string& v : g.inputs()) plan->input_slots.push_back(lowering.slot(v));
  for (const Node& n : g.nodes()) {
    if (lowering.absorbed(n.name)) continue;  // an earlier step computes it (an int8 layer's requantization)
    const DeployLowerFn* lower = deploy_lowerings().find(n.op);
    try {
      if (!lower || !(*lower)(n, lowering)) lowering.add_generic_step(n);
    } catch (const Error& e) {
      rethrow_at("node '" + n.name + "' (" + n.op + "): deploy", e, e.kind());
    } catch (const c10::Error& e) {
      rethrow_at("node '" + n.name + "' (" + n.op + "): deploy", e);
    }
  }
  for (const std::string& v : g.outputs()) plan->output_slots.push_back(lowering.slot(v));
  plan->steps = std::move(lowering.steps());
  plan->num_slots = lowering.num_slots();
  // Each slot is dropped after the last step reading it, unless it is an output.
  std::vector<int64_t> last(plan->num_slots, -1);
  for (size_t i = 0; i < plan->steps.size(); ++i)
    for (size_t s : plan->steps[i].inputs) last[s] = static_cast<int64_t>(i);
  const std::set<size_t> outputs(plan->output_slots.begin(), plan->output_slots.end());
  plan->release.resize(plan->steps.size());
  for (size_t s = 0; s < plan->num_slots; ++s)
    if (last[s] >= 0 && !outputs.count(s)) plan->release[static_cast<size_t>(last[s])].push_back(s);
  plan_ = std::move(plan);
}

Model Model::load(const std::string& checkpoint_path, const Options& options) {
  return Model(load_checkpoint(checkpoint_path).graph, options);
}

std::vector<at::Tensor> Model::forward(const std::vector<at::Tensor>& inputs, std::vector<double>* step_seconds) const {
  const Plan& p = *plan_;
  if (inputs.size() != p.input_slots.size())
    throw Error("deploy::Model: " + std::to_string(inputs.size()) + " inputs given, the model takes " +
                std::to_string(p.input_slots.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined() || !inputs[i].is_cpu())
      throw Error("deploy::Model: input " + std::to_string(i) + " ('" + p.graph.inputs()[i] +
                  "') must be a CPU tensor (the deploy runtime runs on the CPU)");
  at::NoGradGuard no_grad;
  std::vector<Value> frame(p.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i) frame[p.input_slots[i]] = Value::of_tensor(inputs[i]);
  if (step_seconds) step_seconds->assign(p.steps.size(), 0.0);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    const auto t0 = step_seconds ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    try {
      s.run(frame, s);
    } catch (const Error& e) {
      rethrow_at(step_name(s), e, e.kind());
    } catch (const c10::Error& e) {
      rethrow_at(step_name(s), e);
    }
    if (step_seconds) (*step_seconds)[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t r : p.release[i]) frame[r] = Value();
  }
  std::vector<at::Tensor> out;
  for (size_t s : p.output_slots) out.push_back(frame[s].tensor());
  return out;
}

at::Tensor Model::forward(const at::Tensor& input) const {
  if (plan_->input_slots.size() != 1 || plan_->output_slots.size() != 1)
    throw Error("deploy::Model: the model has " + std::to_string(plan_->input_slots.size()) + " inputs and " +
                std::to_string(plan_->output_slots.size()) + " outputs; use forward(std::vector<at::Tensor>)");
  return forward(std::vector<at::Tensor>{input}).front();
}

const Graph& Model::graph() const { return plan_->graph; }

std::vector<StepInfo> Model::steps() const {
  std::vector<StepInfo> out;
  for (const Step& s : plan_->steps) out.push_back({s.nodes, s.kernel});
  return out;
}

int64_t Model::num_packed_layers() const {
  int64_t k = 0;
  for (const Step& s : plan_->steps) k += s.binary ? 1 : 0;
  return k;
}

}  // namespace whittle::deploy
