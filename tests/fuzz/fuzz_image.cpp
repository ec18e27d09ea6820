// libFuzzer target: the JPEG and PNG decoders (data/image_decode.h) on arbitrary bytes in memory,
// keeping the stored channels and converting to gray and to RGB.
#include <vector>

#include "data/image_decode.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static whittle::data::ImageDecoder decoder;
  const std::vector<uint8_t> bytes(data, data + size);
  for (int64_t channels : {0, 1, 3})
    whittle::fuzz::expect_named_errors([&] { decoder.decode(bytes, channels, "input"); });
  return 0;
}
