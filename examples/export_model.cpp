// Export from your own code: a whittle checkpoint (or zoo model) written as ONNX and as TorchScript,
// the TorchScript file loaded back with torch::jit::load and compared with whittle's eval outputs.
// docs/export.md.
//   ./export_model MODEL OUT.onnx OUT.pt      (MODEL: a checkpoint .h5 or a zoo name)

#include <whittle/whittle.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: export_model MODEL OUT.onnx OUT.pt\n";
    return 2;
  }
  const std::string model = argv[1];
  try {
    const whittle::Graph graph =
        whittle::is_hdf5_file(model) ? whittle::load_checkpoint(model).graph : whittle::build_model(model);
    whittle::OnnxOptions onnx;
    onnx.opset = 17;  // dynamic batch dimension by default
    whittle::export_onnx(graph, argv[2], onnx);
    whittle::export_torchscript(graph, argv[3]);
    const whittle::ExportCheck check = whittle::verify_torchscript_file(graph, argv[3]);
    std::cout << "wrote " << argv[2] << " (" << whittle::check_onnx_file(argv[2]) << " ONNX nodes) and " << argv[3]
              << "; TorchScript outputs " << (check.bitwise_equal ? "bitwise equal" : "differ") << " (max |diff| "
              << check.max_abs_difference << ")\n";
    return check.bitwise_equal ? 0 : 1;
  } catch (const whittle::Error& e) {
    std::cerr << "export_model: " << e.what() << "\n";
    return 1;
  }
}
