// Builds a small network with whittle's graph API, runs it as a LibTorch module, and prints it.
//   ./graph_basics

#include <whittle/whittle.h>

#include <iostream>

int main() {
  using whittle::Node;
  whittle::Graph g;
  g.add_input("x", {1, 1, 28, 28});
  Node conv{"conv1", "conv2d", {"x"}, {}, {{"padding", std::vector<int64_t>{1, 1}}}, {}, {}};
  conv.params.set("weight", at::randn({4, 1, 3, 3}).set_requires_grad(true));
  g.add_node(conv);
  g.add_node(Node{"relu1", "relu", {"conv1"}, {}, {}, {}, {}});
  g.add_node(Node{"pool", "adaptive_avg_pool2d", {"relu1"}, {}, {{"output_size", std::vector<int64_t>{1, 1}}}, {}, {}});
  g.add_node(Node{"flatten", "flatten", {"pool"}, {}, {}, {}, {}});
  Node fc{"fc", "linear", {"flatten"}, {}, {}, {}, {}};
  fc.params.set("weight", at::randn({10, 4}).set_requires_grad(true));
  g.add_node(fc);
  g.set_outputs({"fc"});

  whittle::GraphModule model(g);
  model->eval();
  at::Tensor y = model->forward(at::randn({2, 1, 28, 28}));
  auto cost = whittle::graph_cost(model->graph());
  std::cout << model->graph() << "output " << y.sizes() << ", " << cost.params << " parameters, " << cost.macs
            << " MACs (whittle " << whittle::version() << ")\n";
  return y.size(1) == 10 ? 0 : 1;
}
