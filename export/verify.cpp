#include "export/verify.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "core/file_util.h"
#include "core/hdf5_util.h"
#include "graph/graph_module.h"

namespace whittle {

namespace {

using H5Id = hdf5::Handle;

void write_float_dataset(hid_t parent, const std::string& name, const at::Tensor& t_in, const std::string& value_name) {
  const at::Tensor t = t_in.detach().to(at::kCPU, at::kFloat).contiguous();
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id ds(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr<float>()) < 0)
    throw Error("check data: cannot write dataset '" + name + "'");
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(value_name.size(), 1));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Id sspace(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(ds.get(), "name", type.get(), sspace.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string padded = value_name.empty() ? std::string(1, '\0') : value_name;
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), padded.data()) < 0)
    throw Error("check data: cannot write attribute 'name' of '" + name + "'");
}

}  // namespace

CheckData make_check_data(const Graph& graph, int64_t batch, uint64_t seed) {
  if (batch < 1) throw Error("check data: batch must be ≥ 1, got " + std::to_string(batch));
  at::Generator gen = at::detail::createCPUGenerator(seed);
  CheckData d;
  for (const std::string& v : graph.inputs()) {
    Shape s = graph.value(v).shape;
    if (s.empty()) throw Error("check data: graph input '" + v + "' has no batch dimension");
    s[0] = batch;
    d.inputs.push_back(at::normal(0.0, 1.0, s, gen, at::TensorOptions().dtype(at::kFloat)));
  }
  GraphModule module(graph.clone(/*clone_tensors=*/false));
  module->eval();
  at::NoGradGuard no_grad;
  d.outputs = module->forward(d.inputs);
  return d;
}

void save_check_data(const CheckData& data, const Graph& graph, const std::string& path) {
  write_atomic(path, [&](const std::string& tmp) {
    std::lock_guard<std::mutex> lock(hdf5::library_mutex());
    hdf5::SilenceErrors quiet;
    H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) throw Error(path + ": cannot create the check data file");
    H5Id inputs(H5Gcreate2(file.get(), "inputs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    H5Id outputs(H5Gcreate2(file.get(), "outputs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!inputs.valid() || !outputs.valid()) throw Error(path + ": cannot create groups");
    for (size_t i = 0; i < data.inputs.size(); ++i)
      write_float_dataset(inputs.get(), std::to_string(i), data.inputs[i], graph.inputs().at(i));
    for (size_t i = 0; i < data.outputs.size(); ++i)
      write_float_dataset(outputs.get(), std::to_string(i), data.outputs[i], graph.outputs().at(i));
    if (!file.close()) throw Error(path + ": cannot finish writing the check data file");
  });
}

ExportCheck verify_torchscript_file(const Graph& graph, const std::string& path, int64_t batch, uint64_t seed) {
  if (!is_regular_file(path)) throw Error(path + ": no such file");
  return verify_torchscript_file(make_check_data(graph, batch, seed), path);
}

ExportCheck verify_torchscript_file(const CheckData& d, const std::string& path) {
  if (!is_regular_file(path)) throw Error(path + ": no such file");
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, at::kCPU);
  } catch (const std::exception& ex) {
    throw Error(path + ": cannot load as TorchScript (" + message_of(ex) + ")");
  }
  m.eval();
  std::vector<c10::IValue> args(d.inputs.begin(), d.inputs.end());
  c10::IValue r;
  {
    at::NoGradGuard no_grad;
    r = m.forward(args);
  }
  std::vector<at::Tensor> outs;
  if (r.isTensor()) outs.push_back(r.toTensor());
  else if (r.isTuple())
    for (const auto& e : r.toTupleRef().elements()) outs.push_back(e.toTensor());
  if (outs.size() != d.outputs.size())
    throw Error(path + ": the module returns " + std::to_string(outs.size()) + " outputs, the graph " +
                std::to_string(d.outputs.size()));
  ExportCheck c;
  c.batch = d.inputs.empty() ? 0 : d.inputs[0].size(0);
  c.bitwise_equal = true;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].sizes() != d.outputs[i].sizes())
      throw Error(path + ": output " + std::to_string(i) + " has shape " + shape_str(outs[i].sizes().vec()) + ", whittle's " +
                  shape_str(d.outputs[i].sizes().vec()));
    c.max_abs_difference = std::max(c.max_abs_difference, (outs[i] - d.outputs[i]).abs().max().item<double>());
    c.max_abs_output = std::max(c.max_abs_output, d.outputs[i].abs().max().item<double>());
    c.bitwise_equal = c.bitwise_equal && at::equal(outs[i], d.outputs[i]);
  }
  return c;
}

}  // namespace whittle
