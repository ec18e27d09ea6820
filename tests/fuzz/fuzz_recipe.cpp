// libFuzzer target: the recipe parser and validator (runner/recipe.h) with --set overrides. The
// input is the recipe text, optionally followed by a line "#--set" and one override per line
// ("training.epochs=3"). Relative data paths resolve against the scratch folder, which holds a
// copy of nothing: a recipe naming files fails on them, named.
#include "runner/recipe.h"
#include "tests/fuzz/fuzz_support.h"

#include <sstream>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  const std::string marker = "\n#--set\n";
  if (const size_t at = text.find(marker); at != std::string::npos) {
    std::istringstream rest(text.substr(at + marker.size()));
    text.resize(at + 1);
    for (std::string line; std::getline(rest, line);) overrides.push_back(line);
  }
  const std::string& base = whittle::fuzz::scratch_dir();
  whittle::fuzz::expect_named_errors([&] { whittle::runner::parse_recipe(text, "fuzz.yaml", base, overrides); });
  whittle::fuzz::expect_named_errors([&] { whittle::runner::parse_recipe_data(text, "fuzz.yaml"); });
  return 0;
}
