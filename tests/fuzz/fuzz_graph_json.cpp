// libFuzzer target: the graph structure deserializer (graph/serialize.h) on arbitrary text, with
// a tensor source that zero-fills what the text declares (up to 2^20 elements a tensor: the sizes
// checkpoints declare are checked against the stored bytes by the checkpoint reader, which its own
// target fuzzes), then the graph_to_json round trip of whatever was accepted.
#include <ATen/ATen.h>

#include "graph/serialize.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto source = [](const std::string& node, whittle::TensorRole, const std::string& name, const whittle::Shape& shape,
                   at::ScalarType dtype) {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && n > (int64_t{1} << 20) / d)) throw whittle::Error(node + "." + name + ": too large for the fuzz target");
      n *= d;
    }
    return at::zeros(shape, at::TensorOptions().dtype(dtype));
  };
  whittle::fuzz::expect_named_errors([&] {
    whittle::Graph g = whittle::graph_from_json(text, source, "fuzz.json");
    const std::string again = whittle::graph_to_json(g);
    // What was accepted must read back to the same structure.
    if (whittle::graph_to_json(whittle::graph_from_json(again, source, "round-trip.json")) != again) std::abort();
  });
  return 0;
}
