// libFuzzer target: the image-folder archive reader (data/image_archive.h: libarchive, then the
// JPEG and PNG decoders) on arbitrary bytes, read as split "train" on one decoding thread.
#include "data/image_archive.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "input.tar.gz");
  whittle::data::ImageFolderOptions options;
  options.num_threads = 1;
  whittle::fuzz::expect_named_errors([&] { whittle::data::read_image_archive(path, "train", options); });
  return 0;
}
