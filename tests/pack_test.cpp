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
  for (int64_t bits = 1; bits <= 8; ++bits)
    for (int64_t n : {1, 31, 32, 33, 63, 64, 65}) v.push_back({bits, n});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sizes, PackSweep, ::testing::ValuesIn(sweep()), [](const ::testing::TestParamInfo<PackCase>& i) {
  return "bits" + std::to_string(i.param.bits) + "_n" + std::to_string(i.param.count);
});

// A little-endian bitstream: bit j of code i is stream bit i·bits + j, stream bit k is bit k mod 8 of
// byte k / 8. For 1, 2, 4 and 8 bits that is code i at bit offset (i mod per_byte)·bits.
TEST(Pack, HandPackedBytes) {
  EXPECT_TRUE(q::pack_codes(at::tensor({1, 0, 1, 1}, at::kByte), 1).equal(at::tensor({13}, at::kByte)));
  EXPECT_TRUE(q::pack_codes(at::tensor({1, 2, 3, 0, 3}, at::kByte), 2).equal(at::tensor({57, 3}, at::kByte)));
  EXPECT_TRUE(q::pack_codes(at::tensor({0xA, 0x5, 0xF}, at::kByte), 4).equal(at::tensor({0x5A, 0x0F}, at::kByte)));
  // 1-bit, 9 codes: all ones → 0xFF, 0x01.
  EXPECT_TRUE(q::pack_codes(at::ones({9}, at::kByte), 1).equal(at::tensor({255, 1}, at::kByte)));
  // 3-bit codes 5, 3, 7 = stream 101 110 111 (lowest bit first): 0b11011101 = 221, then code 7's last
  // bit alone in byte 1.
  EXPECT_TRUE(q::pack_codes(at::tensor({5, 3, 7}, at::kByte), 3).equal(at::tensor({221, 1}, at::kByte)));
  EXPECT_TRUE(q::unpack_codes(at::tensor({221, 1}, at::kByte), 3, 3).equal(at::tensor({5, 3, 7}, at::kByte)));
  // 5-bit codes 31, 0, 17: byte 0 = 31 (code 0), byte 1 = stream bits 10 and 14 (code 2's 1s) = 4 + 64.
  EXPECT_TRUE(q::pack_codes(at::tensor({31, 0, 17}, at::kByte), 5).equal(at::tensor({31, 68}, at::kByte)));
  // 7-bit codes 127, 1: byte 0 = 127 + (1 << 7) = 255; 14 bits in 2 bytes.
  EXPECT_TRUE(q::pack_codes(at::tensor({127, 1}, at::kByte), 7).equal(at::tensor({255, 0}, at::kByte)));
  // Float codes of a quantizer pack as their integer values.
  EXPECT_TRUE(q::pack_codes(at::tensor({2.0f, 0.0f, 1.0f}), 2).equal(at::tensor({18}, at::kByte)));
}

TEST(Pack, Errors) {
  EXPECT_THROW(q::pack_codes(at::tensor({4}, at::kByte), 2), Error);  // out of range
  EXPECT_THROW(q::pack_codes(at::tensor({1}, at::kByte), 0), Error);  // unsupported widths
  EXPECT_THROW(q::pack_codes(at::tensor({1}, at::kByte), 9), Error);
  EXPECT_THROW(q::unpack_codes(at::zeros({2}, at::kByte), 3, 6), Error);  // 6 3-bit codes need 3 bytes
  EXPECT_THROW(q::unpack_codes(at::zeros({2}, at::kByte), 1, 17), Error);  // 17 codes need 3 bytes
  EXPECT_THROW(q::unpack_codes(at::zeros({2}, at::kInt), 8, 2), Error);
  EXPECT_EQ(q::pack_codes(at::zeros({0}, at::kByte), 4).numel(), 0);
  EXPECT_EQ(q::unpack_codes(at::zeros({0}, at::kByte), 3, 0).numel(), 0);
}

// A strided view (every other code; every other byte) packs and unpacks as its contiguous copy.
TEST(Pack, StridedInput) {
  at::Tensor codes = at::tensor({5, 0, 3, 0, 7, 0}, at::kByte).slice(0, 0, 6, 2);  // 5, 3, 7
  EXPECT_TRUE(q::pack_codes(codes, 3).equal(at::tensor({221, 1}, at::kByte)));
  at::Tensor bytes = at::tensor({221, 9, 1, 9}, at::kByte).slice(0, 0, 4, 2);  // 221, 1
  EXPECT_TRUE(q::unpack_codes(bytes, 3, 3).equal(at::tensor({5, 3, 7}, at::kByte)));
}

}  // namespace
}  // namespace whittle::test
