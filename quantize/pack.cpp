#include "quantize/pack.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "graph/graph.h"

namespace whittle::quantize {

namespace {

void check_bits(int64_t bits, const char* who) {
  if (bits < 1 || bits > 8)
    throw Error(std::string(who) + ": cannot pack " + std::to_string(bits) + "-bit codes (1 to 8 bits)");
}

at::Tensor checked_codes(const at::Tensor& codes, int64_t bits, const char* who) {
  check_bits(bits, who);
  at::Tensor c = codes.detach().reshape({-1});
  if (c.numel() == 0) return c.to(at::kByte);
  const int64_t lo = c.min().item<int64_t>(), hi = c.max().item<int64_t>();
  if (lo < 0 || hi >= (int64_t{1} << bits))
    throw Error(std::string(who) + ": codes range over [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], outside [0, " + std::to_string((int64_t{1} << bits) - 1) + "] for " + std::to_string(bits) + " bits");
  return c.to(at::kByte);
}

void check_bytes(const at::Tensor& bytes, int64_t bits, int64_t count, const char* who) {
  check_bits(bits, who);
  if (bytes.scalar_type() != at::kByte || bytes.dim() != 1)
    throw Error(std::string(who) + ": packed codes must be a 1-D uint8 tensor, got " +
                std::string(c10::toString(bytes.scalar_type())) + " " + shape_str(bytes.sizes().vec()));
  if (count < 0 || bytes.numel() != packed_size(count, bits))
    throw Error(std::string(who) + ": " + std::to_string(bytes.numel()) + " bytes hold " + std::to_string(bits) +
                "-bit codes, but " + std::to_string(count) + " codes need " + std::to_string(packed_size(count, bits)));
}

}  // namespace

int64_t packed_size(int64_t count, int64_t bits) { return (count * bits + 7) / 8; }

at::Tensor pack_codes(const at::Tensor& codes, int64_t bits) {
  at::Tensor c = checked_codes(codes, bits, "pack_codes");
  const int64_t n = c.numel(), bytes = packed_size(n, bits);
  if (bits == 8) return c.clone();
  // The bitstream, one uint8 per bit: row i holds code i's bits, lowest first. Then each byte is the
  // OR of its eight stream bits shifted into place.
  at::Tensor stream = at::zeros({bytes * 8}, c.options());
  at::Tensor rows = stream.narrow(0, 0, n * bits).view({n, bits});
  for (int64_t j = 0; j < bits; ++j) rows.select(1, j).copy_(at::bitwise_and(at::bitwise_right_shift(c, j), 1));
  at::Tensor by_byte = stream.view({bytes, 8});
  at::Tensor out = by_byte.select(1, 0).clone();
  for (int64_t k = 1; k < 8; ++k) out.bitwise_or_(at::bitwise_left_shift(by_byte.select(1, k), k));
  return out;
}

at::Tensor unpack_codes(const at::Tensor& bytes, int64_t bits, int64_t count) {
  check_bytes(bytes, bits, count, "unpack_codes");
  if (bits == 8) return bytes.clone();
  at::Tensor stream = at::empty({bytes.numel(), 8}, bytes.options());
  for (int64_t k = 0; k < 8; ++k) stream.select(1, k).copy_(at::bitwise_and(at::bitwise_right_shift(bytes, k), 1));
  at::Tensor rows = stream.view({-1}).narrow(0, 0, count * bits).view({count, bits});
  at::Tensor out = rows.select(1, 0).clone();
  for (int64_t j = 1; j < bits; ++j) out.bitwise_or_(at::bitwise_left_shift(rows.select(1, j), j));
  return out;
}

at::Tensor pack_codes_reference(const at::Tensor& codes, int64_t bits) {
  at::Tensor c = checked_codes(codes, bits, "pack_codes").cpu().contiguous();
  const int64_t n = c.numel();
  at::Tensor out = at::zeros({packed_size(n, bits)}, at::kByte);
  const uint8_t* in = c.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < bits; ++j) {
      const int64_t k = i * bits + j;
      o[k / 8] = static_cast<uint8_t>(o[k / 8] | (((in[i] >> j) & 1) << (k % 8)));
    }
  return out;
}

at::Tensor unpack_codes_reference(const at::Tensor& bytes, int64_t bits, int64_t count) {
  check_bytes(bytes, bits, count, "unpack_codes");
  at::Tensor b = bytes.cpu().contiguous();
  at::Tensor out = at::zeros({count}, at::kByte);
  const uint8_t* in = b.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < count; ++i)
    for (int64_t j = 0; j < bits; ++j) {
      const int64_t k = i * bits + j;
      o[i] = static_cast<uint8_t>(o[i] | (((in[k / 8] >> (k % 8)) & 1) << j));
    }
  return out;
}

}  // namespace whittle::quantize
