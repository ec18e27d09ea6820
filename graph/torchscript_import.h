#pragma once
// Import of TorchScript modules (torch.jit.trace or torch.jit.script, saved with torch.jit.save)
// into a whittle Graph with the module's weights.

#include <string>

#include "graph/graph.h"

namespace torch::jit {
struct Module;
}

namespace whittle {

/// Options of import_torchscript.
struct TorchScriptImportOptions {
  /// Parameters and buffers that no imported op reads (e.g. an auxiliary head unused in forward)
  /// are an error by default, because the GraphModule would then lack those state_dict keys;
  /// true skips them instead.
  bool allow_unused_tensors = false;
  /// Rewrites the view → transpose(1, 2) → view sequence of ShuffleNet's channel shuffle into one
  /// channel_shuffle node (exact; lets channel pruning see through it). false keeps the three ops.
  bool fuse_channel_shuffle = true;
};

/// Reads a TorchScript module saved by torch.jit.save (traced or scripted) and builds a Graph that
/// computes the module's forward(x) for an input of `example_input_shape` (NCHW, batch dimension
/// included; the graph stays batch-size independent).
///
/// The forward must take one tensor and return a tensor or a tuple/list of tensors. Calls into
/// submodules are interpreted through their method graphs; integer and shape arithmetic
/// (x.size(i), NumToTensor, floor division, ...) and control flow with constant conditions are
/// folded at the example shape, while sizes derived from the batch dimension are tracked so that
/// x.view(x.size(0), -1) becomes a batch-independent `reshape`. Module state is imported in
/// eval-mode form (`self.training` reads false); batch_norm and dropout switch with
/// GraphModule::train()/eval() themselves.
///
/// Naming: a node that uses a module's weights is named after that module, so the GraphModule's
/// named_parameters()/named_buffers() keys equal the TorchScript module's ("layer1.0.conv1.weight";
/// BatchNorm's num_batches_tracked included). Parameters are copied as requires_grad leaf tensors,
/// buffers as plain tensors. A parameterless op is named after the module whose forward it runs in:
/// the module path itself when that module is a leaf doing one op ("layer1.0.relu"), otherwise the
/// module path plus the op kind ("layer1.0.add", "flatten" at top level); repeated names get "_1",
/// "_2", ... (a ReLU module called twice).
///
/// Mapped aten ops: _convolution/conv2d/conv_transpose2d, batch_norm, linear, addmm/matmul/mm with
/// a transposed weight (+ bias add), relu, relu6, hardtanh, leaky_relu, sigmoid, tanh, silu,
/// hardswish, hardsigmoid, gelu, dropout, feature_dropout, softmax, max_pool2d, avg_pool2d,
/// adaptive_avg_pool2d, flatten, view/reshape, add/mul of two tensors, cat, chunk/split/
/// split_with_sizes, transpose, permute, contiguous (dropped), upsample_nearest2d/
/// upsample_bilinear2d, mean, clone (identity) (in-place variants too; a later use of a tensor
/// changed in place reads the new value).
///
/// Throws whittle::Error naming `path` when the file is missing or not a TorchScript archive, and
/// naming the aten/prim op kind, the module path, the source location and the node text when an op
/// cannot be mapped (e.g. "unsupported op aten::fft_fft2 in 'body.1' (FFTBlock) at model.py:12"),
/// when an argument depends on the batch size where the graph cannot express it, when a module's
/// weights are used by more than one call, or when parameters stay unused (see options).
Graph import_torchscript(const std::string& path, const Shape& example_input_shape,
                         const TorchScriptImportOptions& options = {});

/// The same for a module already loaded with torch::jit::load; `label` names it in error messages.
/// The module is not modified.
Graph import_torchscript(const torch::jit::Module& module, const Shape& example_input_shape,
                         const TorchScriptImportOptions& options = {}, const std::string& label = "<module>");

}  // namespace whittle
