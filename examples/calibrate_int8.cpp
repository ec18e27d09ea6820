// Post-training int8 from your own code: trains a float LeNet-5 briefly on the MNIST digits, folds
// its batch norms, attaches the int8 method's quantizers, sets every activation scale and zero point
// with a calibrator over 4 batches of training digits (no optimizer step), corrects the biases for
// the weights' rounding, evaluates float and int8, and saves a packed checkpoint (one byte a weight).
// docs/quantization.md.
//   ./calibrate_int8 <mnist folder> [steps=300] [calibrator=percentile] [out=lenet5_int8.h5]

#include <torch/optim/sgd.h>
#include <whittle/whittle.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: calibrate_int8 <mnist folder> [steps] [calibrator] [out.h5]\n";
    return 2;
  }
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
  const std::string calibrator = argc > 3 ? argv[3] : "percentile";
  const std::string out = argc > 4 ? argv[4] : "lenet5_int8.h5";
  try {
    whittle::data::Dataset train = whittle::data::load_mnist(argv[1], "train");
    whittle::data::Dataset test = whittle::data::load_mnist(argv[1], "t10k");
    auto normalize = [](const at::Tensor& images) { return (images.to(at::kFloat) / 255.0 - 0.1307) / 0.3081; };

    // A float model to start from (yours would be loaded: whittle::load_checkpoint, or imported).
    at::manual_seed(0);
    whittle::GraphModule model(whittle::build_model("lenet5"));
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    model->train();
    for (int64_t step = 0; step < steps; ++step) {
      at::Tensor idx = at::randint(0, train.size(), {64}, at::kLong);
      at::Tensor loss = at::cross_entropy_loss(model->forward(normalize(train.images.index_select(0, idx))),
                                               train.labels.index_select(0, idx));
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
    }
    model->eval();
    auto top1 = [&](whittle::GraphModule& m) {
      at::NoGradGuard no_grad;
      return m->forward(normalize(test.images)).argmax(1).eq(test.labels).to(at::kDouble).mean().item<double>();
    };
    const double float_top1 = top1(model);

    // Post-training int8: fold BN, attach the quantizers, calibrate, correct the biases.
    std::cout << whittle::fuse::fuse_for_inference(model).summary();
    whittle::quantize::Config config;
    config.method = "int8";
    config.options["calibrator"] = calibrator;
    config.options["calibration_batches"] = int64_t{4};
    config = whittle::quantize::resolve(config);
    const whittle::quantize::Report report = whittle::quantize::apply(model, config);
    std::cout << report.summary();
    model->eval();
    const at::Tensor order = at::randperm(train.size(), at::kLong);
    auto batch = [&](int64_t i) { return normalize(train.images.index_select(0, order.slice(0, 128 * i, 128 * (i + 1)))); };
    const whittle::quantize::Calibration cal = *whittle::quantize::quantizer_method("int8").calibration(config);
    const int64_t set = whittle::quantize::calibrate_learned(model, batch, cal,
                                                             whittle::quantize::nodes_to_initialize(model->graph(), report));
    const int64_t corrected = whittle::quantize::correct_bias(model, batch, cal.batches, report.quantized);
    const double int8_top1 = top1(model);
    std::cout << set << " activation scales from the " << calibrator << " calibrator, " << corrected
              << " biases corrected; test top-1 float " << 100 * float_top1 << "%, int8 " << 100 * int8_top1 << "%\n";

    whittle::save_checkpoint(out, model->graph());
    whittle::GraphModule reloaded(whittle::load_checkpoint(out).graph);
    reloaded->eval();
    const bool same = top1(reloaded) == int8_top1;
    std::cout << "saved " << out << " (" << whittle::file_size(out) << " bytes); reloaded top-1 "
              << (same ? "equal" : "DIFFERS") << "\n";
    // The floor: int8 within 1 point of float. Measured 0.00 to +0.05 with the percentile, minmax and
    // mse calibrators here (2 threads, AVX-512); the margin covers the other models another thread
    // count or instruction set trains in 200 steps.
    return same && int8_top1 >= float_top1 - 0.01 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
