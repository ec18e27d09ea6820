// Knowledge distillation from your own training loop: a frozen teacher (a ResNet-20 here, fresh
// weights for the demo; load_checkpoint("teacher.h5").graph in practice), a smaller student (a
// pruned copy), and a few SGD steps on α·KD + (1 − α)·CE with random images. docs/distillation.md.
//   ./distill_model [STEPS]

#include <torch/optim/sgd.h>
#include <whittle/whittle.h>

#include <iostream>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  try {
    whittle::ZooOptions zo;
    zo.seed = 1;
    whittle::distill::Teacher teacher(whittle::build_model("resnet20", zo));  // eval, frozen, no grad
    whittle::GraphModule student(whittle::build_model("resnet20"));
    whittle::prune::Config half;
    half.target_macs = 0.5;
    whittle::prune::prune(student, half);  // the student: half the MACs
    student->train();
    torch::optim::SGD opt(student->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const at::Tensor x = at::randn({8, 3, 32, 32});
    const at::Tensor y = at::randint(0, 10, {8});
    double first = 0, last = 0;
    for (int i = 0; i < steps; ++i) {
      const at::Tensor t = teacher.forward(x);  // [8, 10] soft targets
      const at::Tensor loss = whittle::distill::kd_mixed_loss(student->forward(x), t, y, /*temperature=*/4.0, /*alpha=*/0.9);
      opt.zero_grad();
      loss.backward();
      opt.step();
      (i == 0 ? first : last) = loss.item<double>();
      std::cout << "step " << i + 1 << ": loss " << loss.item<double>() << "\n";
    }
    return steps < 2 || last < first ? 0 : 1;
  } catch (const whittle::Error& e) {
    std::cerr << "distill_model: " << e.what() << "\n";
    return 1;
  }
}
