#pragma once
// Checking an export against whittle's own eval forward: random inputs, whittle's outputs for
// them, and the comparison with a saved TorchScript file (ONNX files are run by onnxruntime in
// Python; check data written here lets any runtime be compared).

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace whittle {

/// Random inputs and whittle's eval outputs for them.
struct CheckData {
  std::vector<at::Tensor> inputs;   ///< one per graph input: float32 N(0, 1), [batch, declared dims...]
  std::vector<at::Tensor> outputs;  ///< one per graph output, from GraphModule in eval mode on the CPU
};

/// Draws `batch` random inputs (seeded CPU generator) and runs `graph` in eval mode on them.
/// Throws whittle::Error for batch < 1 or when the graph's forward fails (naming the node).
CheckData make_check_data(const Graph& graph, int64_t batch = 4, uint64_t seed = 0);

/// Writes check data as HDF5 (atomically): datasets /inputs/<i> and /outputs/<i> (float32, the
/// tensors' shapes) with a string attribute `name` holding the graph's value name; readable with
/// h5py. Throws whittle::Error naming the path when it cannot be written.
void save_check_data(const CheckData& data, const Graph& graph, const std::string& path);

/// The comparison of an export's outputs with whittle's.
struct ExportCheck {
  double max_abs_difference = 0;  ///< largest |export − whittle| over every output element
  double max_abs_output = 0;      ///< largest |whittle output| (the scale the bound is relative to)
  bool bitwise_equal = false;     ///< every output element identical
  int64_t batch = 0;
};

/// Loads a TorchScript file with torch::jit::load (ATen operators only: no whittle code is
/// involved in running it), runs it on make_check_data(graph, batch, seed) and compares.
/// Throws whittle::Error naming the path when the file does not load or its outputs do not match
/// in number or shape.
ExportCheck verify_torchscript_file(const Graph& graph, const std::string& path, int64_t batch = 4, uint64_t seed = 0);
/// The same comparison against check data already made (make_check_data), so a caller that also
/// saves it runs whittle's forward once. Throws like verify_torchscript_file.
ExportCheck verify_torchscript_file(const CheckData& data, const std::string& path);

}  // namespace whittle
