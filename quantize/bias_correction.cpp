// Empirical bias correction after post-training quantization (Nagel et al., 2019, "Data-Free
// Quantization Through Weight Equalization and Bias Correction", sec. 4.2; the correction NNCF and
// AIMET apply after calibration). Declared in quantize/quantize.h.
//
// Quantizing a weight W to Ŵ shifts each output channel's mean by E[layer(x, Ŵ − W)]: the layers
// after it see a biased input. For each layer, on the layer inputs x the quantized model computes
// (all layers in the same forward passes, before any correction), the error per output channel
// e_c = mean over samples and positions of layer(x, Ŵ − W)_c (the layer is linear in its weight;
// no bias in this term) is subtracted from the layer's bias.

#include <ATen/ATen.h>

#include <map>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/method.h"
#include "quantize/quantize.h"

namespace whittle::quantize {

int64_t correct_bias(GraphModule& module, const std::function<at::Tensor(int64_t)>& batch, int64_t batches,
                     const std::vector<std::string>& layers) {
  register_all();
  if (batches < 1) throw Error("bias correction: " + std::to_string(batches) + " batches (at least 1)", ErrorKind::kUsage);
  at::NoGradGuard no_grad;
  // The layers with a quantized float weight: each a copy running Ŵ − W (masks before the
  // quantizer applied to both) without bias, and the value it reads.
  struct Term {
    std::string layer, input;
    Node difference;
    at::Tensor sum;
    int64_t count = 0;
  };
  std::vector<Term> terms;
  std::vector<std::string> inputs;
  for (const auto& name : layers) {
    const Node& layer = module->graph().node(name);
    const int64_t q = find_transform_kind(layer, TransformKind::kQuantizer);
    if (q < 0 || !layer.params.contains("weight") || !weight_output_axis(layer)) continue;
    Term t{name, layer.inputs.at(0), layer, {}, 0};
    t.difference.weight_transforms.clear();
    t.difference.params.set("weight", transformed_weight(layer, false) - transformed_weight(layer, false, static_cast<size_t>(q)));
    t.difference.params.erase("bias");
    inputs.push_back(t.input);
    terms.push_back(std::move(t));
  }
  if (terms.empty()) return 0;
  for (int64_t i = 0; i < batches; ++i) {
    std::map<std::string, at::Tensor> captured;
    module->forward_with_intermediates({batch(i)}, inputs, &captured);
    for (Term& t : terms) {
      const at::Tensor e = op_traits(t.difference.op).forward(t.difference, {captured.at(t.input)}, false).at(0).to(at::kDouble);
      // The output's channel axis (1 for a convolution, the last for a linear layer on [N, *, in]);
      // every other axis is averaged.
      const int64_t axis = channel_axis(t.difference, e.sizes().vec());
      std::vector<int64_t> dims;
      for (int64_t d = 0; d < e.dim(); ++d)
        if (d != axis) dims.push_back(d);
      const at::Tensor s = e.sum(dims);
      t.sum = t.sum.defined() ? t.sum + s : s;
      t.count += e.numel() / std::max<int64_t>(e.size(axis), 1);
    }
  }
  bool added = false;
  for (const Term& t : terms) {
    Node& target = module->graph().node(t.layer);
    const at::Tensor correction = (t.sum / static_cast<double>(std::max<int64_t>(t.count, 1))).to(at::kFloat);
    if (const at::Tensor* bias = target.params.find("bias"); bias && bias->defined()) {
      if (bias->numel() != correction.numel())
        throw Error("bias correction: node '" + t.layer + "' has a bias of " + std::to_string(bias->numel()) +
                    " elements for " + std::to_string(correction.numel()) + " output channels");
      bias->sub_(correction.to(bias->device(), bias->scalar_type()));
    } else {
      const at::Tensor& w = target.params.at("weight");
      target.params.set("bias", (-correction).to(w.device(), w.scalar_type()).set_requires_grad(w.requires_grad()));
      added = true;
    }
  }
  if (added) module->sync();
  return static_cast<int64_t>(terms.size());
}

}  // namespace whittle::quantize
