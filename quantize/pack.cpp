#include "quantize/pack.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "graph/graph.h"

namespace whittle::quantize {

namespace {

void check_bits(int64_t bits, const char* who) {
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8)
    throw Error(std::string(who) + ": cannot pack " + std::to_string(bits) + "-bit codes (1, 2, 4 or 8)");
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
  const int64_t per = 8 / bits, n = c.numel(), bytes = packed_size(n, bits);
  if (per == 1) return c.clone();
  // Pad to a whole number of bytes, lay codes out as [bytes, per], shift column j by j·bits, and sum.
  at::Tensor padded = at::zeros({bytes * per}, c.options().dtype(at::kInt));
  padded.narrow(0, 0, n).copy_(c);
  at::Tensor shifts = at::arange(per, c.options().dtype(at::kInt)) * static_cast<int>(bits);
  return at::bitwise_left_shift(padded.reshape({bytes, per}), shifts).sum(1).to(at::kByte);
}

at::Tensor unpack_codes(const at::Tensor& bytes, int64_t bits, int64_t count) {
  check_bytes(bytes, bits, count, "unpack_codes");
  const int64_t per = 8 / bits;
  if (per == 1) return bytes.clone();
  at::Tensor b = bytes.to(at::kInt).unsqueeze(1);
  at::Tensor shifts = at::arange(per, b.options()) * static_cast<int>(bits);
  at::Tensor all = at::bitwise_and(at::bitwise_right_shift(b, shifts), (1 << bits) - 1).reshape({-1});
  return all.narrow(0, 0, count).to(at::kByte);
}

at::Tensor pack_codes_reference(const at::Tensor& codes, int64_t bits) {
  at::Tensor c = checked_codes(codes, bits, "pack_codes").cpu().contiguous();
  const int64_t per = 8 / bits, n = c.numel();
  at::Tensor out = at::zeros({packed_size(n, bits)}, at::kByte);
  const uint8_t* in = c.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) o[i / per] = static_cast<uint8_t>(o[i / per] | (in[i] << ((i % per) * bits)));
  return out;
}

at::Tensor unpack_codes_reference(const at::Tensor& bytes, int64_t bits, int64_t count) {
  check_bytes(bytes, bits, count, "unpack_codes");
  at::Tensor b = bytes.cpu().contiguous();
  const int64_t per = 8 / bits;
  at::Tensor out = at::empty({count}, at::kByte);
  const uint8_t* in = b.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  const int mask = (1 << bits) - 1;
  for (int64_t i = 0; i < count; ++i) o[i] = static_cast<uint8_t>((in[i / per] >> ((i % per) * bits)) & mask);
  return out;
}

}  // namespace whittle::quantize
