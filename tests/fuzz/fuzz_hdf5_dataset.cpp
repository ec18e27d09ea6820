// libFuzzer target: the HDF5 dataset reader (data/hdf5_dataset.h) on arbitrary bytes.
#include "data/hdf5_dataset.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "input.h5");
  whittle::fuzz::expect_named_errors([&] { whittle::data::read_hdf5_dataset(path); });
  return 0;
}
