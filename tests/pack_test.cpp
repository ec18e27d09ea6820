// Bit packing: the tensor implementation against the plain-loop reference over edge sizes and
// every width, hand-packed bytes, and errors.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quantize/pack.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

struct PackCase {
  int64_t bits;
  int64_t count;
};

class PackSweep : public SeededTest, public ::testing::WithParamInterface<PackCase> {};

TEST_P(PackSweep, MatchesReferenceAndRoundTrips) {
  const auto [bits, count] = GetParam();
  at::Tensor codes = at::randint(0, int64_t{1} << bits, {count}, at::kByte);
  at::Tensor packed = q::pack_codes(codes, bits);
  ASSERT_EQ(packed.numel(), (count * bits + 7) / 8);
  EXPECT_TRUE(packed.equal(q::pack_codes_reference(codes, bits)));
  EXPECT_TRUE(q::unpack_codes(packed, bits, count).equal(codes));
  EXPECT_TRUE(q::unpack_codes_reference(packed, bits, count).equal(codes));
  if (at::hasCUDA()) {
    at::Tensor on_gpu = q::pack_codes(codes.cuda(), bits);
    EXPECT_TRUE(on_gpu.cpu().equal(packed));
    EXPECT_TRUE(q::unpack_codes(on_gpu, bits, count).cpu().equal(codes));
  }
}

std::vector<PackCase> sweep() {
  std::vector<PackCase> v;
  for (int64_t bits : {1, 2, 4, 8})
    for (int64_t n : {1, 31, 32, 33, 63, 64, 65}) v.push_back({bits, n});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sizes, PackSweep, ::testing::ValuesIn(sweep()), [](const ::testing::TestParamInfo<PackCase>& i) {
  return "bits" + std::to_string(i.param.bits) + "_n" + std::to_string(i.param.count);
});

// Little-endian within the byte: code i at bit offset (i mod per_byte)·bits.
TEST(Pack, HandPackedBytes) {
  EXPECT_TRUE(q::pack_codes(at::tensor({1, 0, 1, 1}, at::kByte), 1).equal(at::tensor({13}, at::kByte)));
  EXPECT_TRUE(q::pack_codes(at::tensor({1, 2, 3, 0, 3}, at::kByte), 2).equal(at::tensor({57, 3}, at::kByte)));
  EXPECT_TRUE(q::pack_codes(at::tensor({0xA, 0x5, 0xF}, at::kByte), 4).equal(at::tensor({0x5A, 0x0F}, at::kByte)));
  // 1-bit, 9 codes: all ones → 0xFF, 0x01.
  EXPECT_TRUE(q::pack_codes(at::ones({9}, at::kByte), 1).equal(at::tensor({255, 1}, at::kByte)));
  // Float codes of a quantizer pack as their integer values.
  EXPECT_TRUE(q::pack_codes(at::tensor({2.0f, 0.0f, 1.0f}), 2).equal(at::tensor({18}, at::kByte)));
}

TEST(Pack, Errors) {
  EXPECT_THROW(q::pack_codes(at::tensor({4}, at::kByte), 2), Error);  // out of range
  EXPECT_THROW(q::pack_codes(at::tensor({1}, at::kByte), 3), Error);  // unsupported width
  EXPECT_THROW(q::unpack_codes(at::zeros({2}, at::kByte), 1, 17), Error);  // 17 codes need 3 bytes
  EXPECT_THROW(q::unpack_codes(at::zeros({2}, at::kInt), 8, 2), Error);
  EXPECT_EQ(q::pack_codes(at::zeros({0}, at::kByte), 4).numel(), 0);
}

}  // namespace
}  // namespace whittle::test
