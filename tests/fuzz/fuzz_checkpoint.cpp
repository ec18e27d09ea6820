// libFuzzer target: the checkpoint reader (export/checkpoint.h) on arbitrary bytes. Both entry
// points that read a file: load_checkpoint (structure, index, every tensor's CRC-32) and
// checkpoint_tensor_names (the index alone).
#include "export/checkpoint.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "input.h5");
  whittle::fuzz::expect_named_errors([&] { whittle::load_checkpoint(path); });
  whittle::fuzz::expect_named_errors([&] { whittle::checkpoint_tensor_names(path); });
  return 0;
}
