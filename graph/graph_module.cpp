#include "graph/graph_module.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle {

GraphModuleImpl::GraphModuleImpl(Graph graph) : torch::nn::Module("GraphModule"), graph_(std::move(graph)) { sync(); }

void GraphModuleImpl::sync() {
  graph_.validate();
  register_tensors();
  build_plan();
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
  std::vector<at::Tensor> args;
  for (const auto& step : plan_) {
    args.clear();
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
    if (!captured)
      for (size_t s : step.release) env[s].reset();
    args.clear();
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
