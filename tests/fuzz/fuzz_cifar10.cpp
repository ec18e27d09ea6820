// libFuzzer target: the CIFAR-10 binary batch reader (data/cifar.h) on arbitrary bytes.
#include "data/cifar.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "data_batch_1.bin");
  whittle::fuzz::expect_named_errors([&] { whittle::data::read_cifar10({path}); });
  return 0;
}
