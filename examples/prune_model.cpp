// Channel pruning from your own code: the dependency groups of a zoo model, then half its MACs
// removed by L1 importance (physical removal), checked to run and to be smaller, and written as a
// checkpoint whose tensors are smaller. docs/pruning.md.
//   ./prune_model [MODEL] [OUT.h5]      (MODEL: a zoo name, default resnet20)

#include <whittle/whittle.h>

#include <iostream>

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "resnet20";
  const std::string out = argc > 2 ? argv[2] : "pruned.h5";
  try {
    whittle::GraphModule model(whittle::build_model(name));
    model->eval();
    const auto groups = whittle::prune::dependency_groups(model->graph());
    std::cout << groups.size() << " dependency groups; the first with a layer:\n";
    for (const auto& g : groups)
      if (!g.producers().empty()) {
        std::cout << g.to_string();
        break;
      }
    whittle::prune::Config config;
    config.target_macs = 0.5;  // keep half the MACs
    const whittle::prune::Report report = whittle::prune::prune(model, config);
    std::cout << report.summary();
    const whittle::Shape in = model->graph().value(model->graph().inputs().front()).shape;
    at::NoGradGuard no_grad;
    const at::Tensor y = model->forward(at::randn({2, in[1], in[2], in[3]}));
    whittle::save_checkpoint(out, model->graph());
    std::cout << "output " << y.sizes() << "; wrote " << out << "\n";
    return report.after.macs * 2 <= report.before.macs ? 0 : 1;
  } catch (const whittle::Error& e) {
    std::cerr << "prune_model: " << e.what() << "\n";
    return 1;
  }
}
