// libFuzzer target: the IDX readers (data/mnist.h) on arbitrary bytes, as an image file and as a
// label file, uncompressed and as the .gz the MNIST files ship as (the reader sniffs gzip).
#include "data/mnist.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "input-idx3-ubyte");
  whittle::fuzz::expect_named_errors([&] { whittle::data::read_idx_images(path); });
  whittle::fuzz::expect_named_errors([&] { whittle::data::read_idx_labels(path); });
  return 0;
}
