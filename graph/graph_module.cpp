#include "graph/graph_module.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <set>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle {

GraphModuleImpl::GraphModuleImpl(Graph graph) : torch::nn::Module("GraphModule"), graph_(std::move(graph)) { sync(); }

void GraphModuleImpl::sync() {
  graph_.validate();
  register_tensors();
  build_plan();
  build_segments();
}

namespace {

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

void GraphModuleImpl::register_tensors() {
  for (const auto& c : top_children_) unregister_module(c);
  top_children_.clear();
  std::map<std::string, std::shared_ptr<torch::nn::Module>> path_modules;
  for (auto& node : graph_.nodes()) {
    if (node.params.empty() && node.buffers.empty()) continue;
    // Walk/create the module path "a.b.c".
    std::vector<std::string> parts = split_dots(node.name);
    torch::nn::Module* parent = this;
    std::string path;
    std::shared_ptr<torch::nn::Module> holder;
    for (const auto& part : parts) {
      if (part.empty()) throw Error("node '" + node.name + "': empty component in dotted name");
      path += (path.empty() ? "" : ".") + part;
      auto it = path_modules.find(path);
      if (it == path_modules.end()) {
        auto m = std::make_shared<torch::nn::Module>(part);
        parent->register_module(part, m);
        if (parent == this) top_children_.push_back(part);
        it = path_modules.emplace(path, m).first;
      }
      holder = it->second;
      parent = holder.get();
    }
    for (auto& kv : node.params) {
      if (!kv.second.defined()) continue;
      // The registered tensor and the node's tensor must be the same object, so keep the node's.
      kv.second = holder->register_parameter(kv.first, kv.second, kv.second.requires_grad());
    }
    for (auto& kv : node.buffers) {
      if (!kv.second.defined()) continue;
      kv.second = holder->register_buffer(kv.first, kv.second);
    }
  }
}

void GraphModuleImpl::build_plan() {
  plan_.clear();
  slot_of_.clear();
  input_slots_.clear();
  output_slots_.clear();
  size_t next = 0;
  auto slot = [&](const std::string& v) {
    auto it = slot_of_.find(v);
    if (it != slot_of_.end()) return it->second;
    slot_of_[v] = next;
    return next++;
  };
  for (const auto& in : graph_.inputs()) input_slots_.push_back(slot(in));
  for (const auto& node : graph_.nodes()) {
    Step s{&node, &op_traits(node.op), {}, {}, {}, nullptr, {}};
    for (const auto& name : node.weight_transforms) s.transforms.push_back(&weight_transform(name));
    if (!s.transforms.empty()) s.shadow = std::make_shared<Node>(node);
    for (const auto& v : node.inputs) s.inputs.push_back(slot(v));
    for (const auto& v : node.outputs) s.outputs.push_back(slot(v));
    plan_.push_back(std::move(s));
  }
  for (const auto& out : graph_.outputs()) output_slots_.push_back(slot(out));
  num_slots_ = next;
  // Drop each intermediate value after its last use, as eager PyTorch does, so that memory not
  // held by autograd is freed during the forward (graph outputs are kept).
  std::vector<size_t> last_use(num_slots_, plan_.size());
  for (size_t i = 0; i < plan_.size(); ++i)
    for (size_t s : plan_[i].inputs) last_use[s] = i;
  for (size_t s : output_slots_) last_use[s] = plan_.size();
  for (size_t s = 0; s < num_slots_; ++s)
    if (last_use[s] < plan_.size()) plan_[last_use[s]].release.push_back(s);
}

void GraphModuleImpl::run_step(const Step& step, std::vector<at::Tensor>& env, bool training) const {
  std::vector<at::Tensor> args;
  args.reserve(step.inputs.size());
  for (size_t s : step.inputs) args.push_back(env[s]);
  const Node* node = step.node;
  std::vector<at::Tensor> outs;
  try {
    if (!step.transforms.empty()) {
      // The shadow shares every tensor with the node; only its weight is the transformed one.
      step.shadow->params = node->params;
      step.shadow->buffers = node->buffers;
      const at::Tensor* latent = node->params.find("weight");
      at::Tensor weight = latent ? *latent : at::Tensor();
      for (const WeightTransform* t : step.transforms) weight = t->apply(*node, weight, training);
      step.shadow->params.set("weight", weight);
      node = step.shadow.get();
    }
    outs = step.traits->forward(*node, args, training);
  } catch (const c10::Error& e) {
    // ATen's message without its C++ backtrace, with the node that raised it.
    std::string msg = e.what_without_backtrace();
    if (const size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    std::string shapes;
    for (const auto& a : args) shapes += (shapes.empty() ? "" : ", ") + (a.defined() ? shape_str(a.sizes().vec()) : "none");
    throw Error("node '" + step.node->name + "' (" + step.node->op + "), inputs " + shapes + ": " + msg);
  } catch (const Error& e) {
    // Errors of the op itself that do not name the node yet get its name.
    const std::string msg = e.what();
    if (msg.rfind("node '", 0) == 0) throw;
    throw Error("node '" + step.node->name + "' (" + step.node->op + "): " + msg, e.kind());
  }
  if (outs.size() != step.outputs.size())
    throw Error("node '" + step.node->name + "' (" + step.node->op + "): forward returned " + std::to_string(outs.size()) +
                " outputs, expected " + std::to_string(step.outputs.size()));
  for (size_t i = 0; i < outs.size(); ++i) env[step.outputs[i]] = std::move(outs[i]);
}

namespace {

bool in_segment(const std::string& node, const std::string& prefix) {
  return node == prefix || (node.size() > prefix.size() && node.compare(0, prefix.size(), prefix) == 0 &&
                            node[prefix.size()] == '.');
}

}  // namespace

void GraphModuleImpl::set_checkpoint_segments(const std::vector<std::string>& prefixes) {
  const std::vector<std::string> previous = std::move(checkpoint_prefixes_);
  checkpoint_prefixes_ = prefixes;
  try {
    build_segments();
  } catch (...) {
    checkpoint_prefixes_ = previous;
    build_segments();
    throw;
  }
}

void GraphModuleImpl::build_segments() {
  segments_.clear();
  segment_at_.assign(plan_.size(), -1);
  std::vector<int> owner(plan_.size(), -1);  // segment of each step
  for (const auto& prefix : checkpoint_prefixes_) {
    Segment seg;
    seg.prefix = prefix;
    bool found = false;
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (!in_segment(plan_[i].node->name, prefix)) continue;
      if (!found) seg.begin = i;
      else if (i != seg.end)
        throw Error("activation checkpointing: the nodes of segment '" + prefix + "' are not one run in graph order (node '" +
                    plan_[i].node->name + "' comes after '" + plan_[seg.end].node->name + "', which is not in it)");
      found = true;
      seg.end = i + 1;
    }
    if (!found) throw Error("activation checkpointing: segment '" + prefix + "' names no node of the graph");
    for (size_t i = seg.begin; i < seg.end; ++i)
      if (owner[i] >= 0)
        throw Error("activation checkpointing: segments '" + segments_[owner[i]].prefix + "' and '" + prefix +
                    "' overlap (node '" + plan_[i].node->name + "')");
    const int index = static_cast<int>(segments_.size());
    for (size_t i = seg.begin; i < seg.end; ++i) owner[i] = index;
    std::set<size_t> produced, inputs;
    for (size_t i = seg.begin; i < seg.end; ++i) {
      for (size_t s : plan_[i].inputs)
        if (!produced.count(s) && inputs.insert(s).second) seg.inputs.push_back(s);
      for (size_t s : plan_[i].outputs) produced.insert(s);
    }
    std::set<size_t> used_after(output_slots_.begin(), output_slots_.end());
    for (size_t i = seg.end; i < plan_.size(); ++i) used_after.insert(plan_[i].inputs.begin(), plan_[i].inputs.end());
    for (size_t i = seg.begin; i < seg.end; ++i)
      for (size_t s : plan_[i].outputs)
        if (used_after.count(s)) seg.outputs.push_back(s);
    segment_at_[seg.begin] = index;
    segments_.push_back(std::move(seg));
  }
}

std::vector<at::Tensor> GraphModuleImpl::run_segment(const Segment& s, const std::vector<at::Tensor>& inputs,
                                                     bool training) const {
  std::vector<at::Tensor> env(num_slots_);
  for (size_t k = 0; k < s.inputs.size(); ++k) env[s.inputs[k]] = inputs[k];
  for (size_t i = s.begin; i < s.end; ++i) run_step(plan_[i], env, training);
  std::vector<at::Tensor> out;
  out.reserve(s.outputs.size());
  for (size_t slot : s.outputs) out.push_back(env[slot]);
  return out;
}

std::vector<at::Tensor> GraphModuleImpl::segment_params(const Segment& s) const {
  std::vector<at::Tensor> params;
  for (size_t i = s.begin; i < s.end; ++i)
    for (const auto& kv : plan_[i].node->params)
      if (kv.second.defined() && kv.second.requires_grad()) params.push_back(kv.second);
  return params;
}

// One checkpointed segment as an autograd function: its inputs are the segment's input values and
// its trainable parameters (so that the engine hands their gradients to the parameters), its
// outputs the segment's outputs. The forward keeps the inputs and the random and autocast state;
// the backward restores them, runs the segment again with gradients on, and differentiates it.
struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList args,
                                                const GraphModuleImpl* module, int64_t segment) {
    const auto& seg = module->segments_[segment];
    const std::vector<at::Tensor> inputs(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(seg.inputs.size()));
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    ctx->saved_data["segment"] = segment;
    ctx->saved_data["args"] = static_cast<int64_t>(args.size());
    ctx->saved_data["cpu_rng"] = at::detail::getDefaultCPUGenerator().get_state();
    at::Device cuda_device(at::kCPU);
    for (const auto& t : inputs)
      if (t.defined() && t.is_cuda()) cuda_device = t.device();
    if (cuda_device.is_cuda()) {
      ctx->saved_data["cuda_rng"] = at::globalContext().defaultGenerator(cuda_device).get_state();
      ctx->saved_data["cuda_device"] = static_cast<int64_t>(cuda_device.index());
    }
    for (const auto type : {at::kCPU, at::kCUDA}) {
      const std::string key = std::string("autocast_") + c10::DeviceTypeName(type, true);
      ctx->saved_data[key] = at::autocast::is_autocast_enabled(type);
      ctx->saved_data[key + "_dtype"] = at::autocast::get_autocast_dtype(type);
    }
    ctx->save_for_backward(inputs);
    return module->run_segment(seg, inputs, /*training=*/true);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* module = reinterpret_cast<const GraphModuleImpl*>(ctx->saved_data["module"].toInt());
    const auto& seg = module->segments_[ctx->saved_data["segment"].toInt()];
    const int64_t num_args = ctx->saved_data["args"].toInt();
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const std::vector<at::Tensor> params = module->segment_params(seg);
    // The state the recomputation needs, restored afterwards: random generators, autocast, buffers.
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    const at::Tensor cpu_now = cpu.get_state();
    cpu.set_state(ctx->saved_data["cpu_rng"].toTensor());
    std::optional<at::Generator> cuda;
    at::Tensor cuda_now;
    if (ctx->saved_data.count("cuda_rng")) {
      cuda = at::globalContext().defaultGenerator(at::Device(at::kCUDA, ctx->saved_data["cuda_device"].toInt()));
      cuda_now = cuda->get_state();
      cuda->set_state(ctx->saved_data["cuda_rng"].toTensor());
    }
    std::vector<std::pair<at::DeviceType, std::pair<bool, at::ScalarType>>> autocast_now;
    for (const auto type : {at::kCPU, at::kCUDA}) {
      const std::string key = std::string("autocast_") + c10::DeviceTypeName(type, true);
      autocast_now.push_back({type, {at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)}});
      at::autocast::set_autocast_enabled(type, ctx->saved_data[key].toBool());
      at::autocast::set_autocast_dtype(type, ctx->saved_data[key + "_dtype"].toScalarType());
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (buffer, its value before the recomputation)
    for (size_t i = seg.begin; i < seg.end; ++i)
      for (const auto& kv : module->plan_[i].node->buffers)
        if (kv.second.defined()) buffers.emplace_back(kv.second, kv.second.clone());
    std::vector<at::Tensor> inputs, outputs;
    {
      at::AutoGradMode grad_on(true);
      for (const auto& t : saved) inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
      outputs = module->run_segment(seg, inputs, /*training=*/true);
    }
    cpu.set_state(cpu_now);
    if (cuda) cuda->set_state(cuda_now);
    for (const auto& [type, state] : autocast_now) {
      at::autocast::set_autocast_enabled(type, state.first);
      at::autocast::set_autocast_dtype(type, state.second);
    }
    // d(outputs)/d(inputs, parameters) for the outputs that have a gradient.
    std::vector<at::Tensor> outs, grads, targets;
    for (size_t k = 0; k < outputs.size(); ++k)
      if (outputs[k].defined() && outputs[k].requires_grad() && grad_outputs[k].defined()) {
        outs.push_back(outputs[k]);
        grads.push_back(grad_outputs[k]);
      }
    std::vector<int64_t> target_of(static_cast<size_t>(num_args), -1);
    for (size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].defined() && inputs[k].requires_grad()) {
        target_of[k] = static_cast<int64_t>(targets.size());
        targets.push_back(inputs[k]);
      }
    for (size_t k = 0; k < params.size() && inputs.size() + k < target_of.size(); ++k) {
      target_of[inputs.size() + k] = static_cast<int64_t>(targets.size());
      targets.push_back(params[k]);
    }
    torch::autograd::variable_list result(static_cast<size_t>(num_args) + 2);  // + module, segment
    std::vector<at::Tensor> d;
    if (!outs.empty() && !targets.empty())
      d = torch::autograd::grad(outs, targets, grads, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    // After the gradients: batch norm's backward reads the running statistics it was given.
    {
      at::NoGradGuard no_grad;
      for (auto& [buffer, before] : buffers) buffer.copy_(before);
    }
    if (d.empty()) return result;
    for (int64_t k = 0; k < num_args; ++k)
      if (target_of[k] >= 0) result[k] = d[target_of[k]];
    return result;
  }
};

void GraphModuleImpl::run_checkpointed(int index, std::vector<at::Tensor>& env) const {
  const Segment& seg = segments_[index];
  torch::autograd::variable_list args;
  for (size_t s : seg.inputs) args.push_back(env[s]);
  for (const auto& p : segment_params(seg)) args.push_back(p);
  torch::autograd::variable_list outs = CheckpointFn::apply(at::TensorList(args), this, static_cast<int64_t>(index));
  for (size_t k = 0; k < seg.outputs.size(); ++k) env[seg.outputs[k]] = std::move(outs[k]);
}

at::Tensor GraphModuleImpl::forward(const at::Tensor& input) {
  if (graph_.inputs().size() != 1 || graph_.outputs().size() != 1)
    throw Error("GraphModule::forward(Tensor) needs a graph with one input and one output; this one has " +
                std::to_string(graph_.inputs().size()) + " and " + std::to_string(graph_.outputs().size()));
  return forward(std::vector<at::Tensor>{input})[0];
}

std::vector<at::Tensor> GraphModuleImpl::forward(const std::vector<at::Tensor>& inputs) {
  return forward_with_intermediates(inputs, {}, nullptr);
}

std::vector<at::Tensor> GraphModuleImpl::forward_with_intermediates(const std::vector<at::Tensor>& inputs,
                                                                    const std::vector<std::string>& capture,
                                                                    std::map<std::string, at::Tensor>* captured) {
  if (inputs.size() != input_slots_.size())
    throw Error("GraphModule: graph takes " + std::to_string(input_slots_.size()) + " inputs, got " +
                std::to_string(inputs.size()));
  std::vector<at::Tensor> env(num_slots_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Shape& declared = graph_.value(graph_.inputs()[i]).shape;
    if (inputs[i].dim() != static_cast<int64_t>(declared.size()) ||
        (declared.size() > 1 && inputs[i].sizes().slice(1) != at::IntArrayRef(declared).slice(1))) {
      Shape expected = declared;
      if (!expected.empty()) expected[0] = inputs[i].dim() > 0 ? inputs[i].size(0) : 1;
      throw Error("GraphModule: input '" + graph_.inputs()[i] + "' has shape " + shape_str(inputs[i].sizes().vec()) +
                  ", expected " + shape_str(expected) + " (any batch size)");
    }
    env[input_slots_[i]] = inputs[i];
  }
  const bool training = is_training();
  const bool checkpointing = !segments_.empty() && !captured && training && at::GradMode::is_enabled();
  for (size_t i = 0; i < plan_.size();) {
    if (checkpointing && segment_at_[i] >= 0) {
      const Segment& seg = segments_[segment_at_[i]];
      run_checkpointed(segment_at_[i], env);
      for (size_t j = seg.begin; j < seg.end; ++j)
        for (size_t slot : plan_[j].release) env[slot].reset();
      i = seg.end;
      continue;
    }
    const Step& step = plan_[i++];
    run_step(step, env, training);
    if (!captured)
      for (size_t slot : step.release) env[slot].reset();
  }
  if (captured) {
    for (const auto& name : capture) {
      auto it = slot_of_.find(name);
      if (it == slot_of_.end()) throw Error("GraphModule: cannot capture '" + name + "': no such node or value");
      (*captured)[name] = env[it->second];
    }
  }
  std::vector<at::Tensor> out;
  for (size_t s : output_slots_) out.push_back(env[s]);
  return out;
}

void GraphModuleImpl::convert(std::optional<torch::Device> device, std::optional<torch::Dtype> dtype, bool non_blocking) {
  auto move = [&](at::Tensor& t) {
    if (!t.defined()) return;
    at::TensorOptions opts = t.options();
    if (device) opts = opts.device(*device);
    if (dtype && at::isFloatingType(t.scalar_type())) opts = opts.dtype(*dtype);
    at::Tensor converted = t.to(opts, non_blocking);
    if (!converted.is_same(t)) {
      at::NoGradGuard guard;
      t.set_data(converted);
    }
  };
  for (auto& node : graph_.nodes()) {
    for (auto& kv : node.params) move(kv.second);
    for (auto& kv : node.buffers) move(kv.second);
  }
}

void GraphModuleImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) { convert(device, dtype, non_blocking); }
void GraphModuleImpl::to(torch::Dtype dtype, bool non_blocking) { convert(std::nullopt, dtype, non_blocking); }
void GraphModuleImpl::to(torch::Device device, bool non_blocking) { convert(device, std::nullopt, non_blocking); }

}  // namespace whittle
