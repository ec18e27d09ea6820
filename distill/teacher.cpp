// The frozen teacher of distillation (distill.h).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "distill/distill.h"

namespace whittle::distill {

Teacher::Teacher(Graph graph) : module_(std::move(graph)) {
  const auto params = module_->parameters();
  for (auto p : params) p.requires_grad_(false);
  if (!params.empty()) device_ = params.front().device();
  module_->eval();
}

at::Tensor Teacher::forward(const at::Tensor& x, const std::vector<std::string>& capture,
                            std::map<std::string, at::Tensor>* features) {
  at::NoGradGuard no_grad;
  module_->eval();  // whatever train() was called on: BN uses its running statistics, no dropout
  const at::Tensor input = x.device() == device_ ? x.detach() : x.detach().to(device_);
  if (capture.empty()) return module_->forward(input);
  std::map<std::string, at::Tensor> captured;
  std::vector<at::Tensor> out = module_->forward_with_intermediates({input}, capture, &captured);
  if (features)
    for (auto& [k, v] : captured) (*features)[k] = v;
  return out.at(0);
}

void Teacher::to(at::Device device) {
  module_->to(device);
  device_ = device;
  for (auto& p : module_->parameters()) p.requires_grad_(false);
}

}  // namespace whittle::distill
