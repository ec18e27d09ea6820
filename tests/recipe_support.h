#pragma once
// Helpers of the suites that run short recipes (prune_recipe_test, distill_test).

#include <string>

#include "core/file_util.h"
#include "runner/recipe.h"
#include "support.h"

namespace whittle::test {

/// `<build>/testdata/<sub>`, emptied (removed, its parent created): a run directory for a test.
inline std::string fresh_dir(const std::string& sub) {
  const std::string dir = join_path(binary_dir(), "testdata/" + sub);
  remove_tree(dir);
  make_directories(parent_directory(dir));
  return dir;
}

/// LeNet-5 on the first 256 bundled training digits in batches of 32 (8 steps an epoch), 64 test
/// digits, SGD lr 0.01 with momentum, one thread, for `epochs`, with the `modifiers` list (YAML
/// lines "  - {...}").
inline runner::Recipe lenet5_quick_recipe(int epochs, const std::string& modifiers) {
  const std::string mnist = join_path(source_dir(), "data/mnist10k");
  return runner::parse_recipe("model: {name: lenet5}\n"
                              "data: {train: " + mnist + ", test: " + mnist +
                                  ", test_split: t10k, batch_size: 32, train_limit: 256, test_limit: 64, num_workers: 0}\n"
                                  "training: {epochs: " + std::to_string(epochs) +
                                  ", optimizer: {name: sgd, lr: 0.01, momentum: 0.9}, threads: 1}\n"
                                  "modifiers:\n" + modifiers,
                              "r.yaml", source_dir());
}

}  // namespace whittle::test
