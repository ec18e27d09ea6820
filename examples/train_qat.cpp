// Quantization-aware training from your own LibTorch loop: builds LeNet-5 from the zoo, attaches
// DoReFa W4A4 quantizers (or another method), trains with a plain SGD loop on the MNIST digits,
// evaluates, and saves a packed checkpoint (4-bit codes instead of float weights).
//   ./train_qat <mnist folder> [steps=300] [method=dorefa] [out=lenet5_qat.h5]
// e.g. ./train_qat data/mnist10k 300 bnn

#include <torch/optim/sgd.h>
#include <whittle/whittle.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: train_qat <mnist folder> [steps] [method] [out.h5]\n";
    return 2;
  }
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
  const std::string method = argc > 3 ? argv[3] : "dorefa";
  const std::string out = argc > 4 ? argv[4] : "lenet5_qat.h5";
  try {
    whittle::data::Dataset train = whittle::data::load_mnist(argv[1], "train");
    whittle::data::Dataset test = whittle::data::load_mnist(argv[1], "t10k");
    auto normalize = [](const at::Tensor& images) { return (images.to(at::kFloat) / 255.0 - 0.1307) / 0.3081; };

    at::manual_seed(0);
    whittle::GraphModule model(whittle::build_model("lenet5"));
    whittle::quantize::Config config;
    config.method = method;
    // 4-bit weights and activations where the method has them; its defaults otherwise.
    const whittle::quantize::QuantizerMethod& m = whittle::quantize::quantizer_method(method);
    if (m.weight_bits_text().find("..") != std::string::npos) config.weight_bits = config.activation_bits = 4;
    config = whittle::quantize::resolve(config);
    whittle::quantize::Report report = whittle::quantize::apply(model, config);
    std::cout << report.summary();

    // Build the optimizer after apply(): the pass re-registers the module's parameters.
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    model->train();
    const int64_t batch = 64, n = train.size();
    for (int64_t step = 0; step < steps; ++step) {
      at::Tensor idx = at::randint(0, n, {batch}, at::kLong);
      at::Tensor x = normalize(train.images.index_select(0, idx));
      at::Tensor y = train.labels.index_select(0, idx);
      at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      whittle::quantize::after_step(model->graph(), config);  // BNN clips its latent weights; others do nothing
      if ((step + 1) % 100 == 0) std::cout << "step " << step + 1 << ": loss " << loss.item<double>() << "\n";
    }

    model->eval();
    at::NoGradGuard no_grad;
    at::Tensor logits = model->forward(normalize(test.images));
    const double top1 = logits.argmax(1).eq(test.labels).to(at::kDouble).mean().item<double>();
    std::cout << "test top-1 " << 100 * top1 << "% on " << test.size() << " images\n";

    whittle::save_checkpoint(out, model->graph());
    whittle::GraphModule reloaded(whittle::load_checkpoint(out).graph);
    reloaded->eval();
    const bool same = reloaded->forward(normalize(test.images)).equal(logits);
    std::cout << "saved " << out << " (" << whittle::file_size(out) << " bytes); reloaded outputs "
              << (same ? "bitwise equal" : "DIFFER") << "\n";
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
