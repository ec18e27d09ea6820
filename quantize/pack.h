#pragma once
// Bit packing of integer codes, as packed checkpoints store them.
//
// Layout: a little-endian bitstream. Codes of `bits` bits (1 to 8) follow each other without gaps:
// bit j of code i is bit i·bits + j of the stream, and bit k of the stream is bit k mod 8 of byte
// k / 8. The last byte is zero-padded. So 1-bit codes [1,0,1,1] pack to 0b00001101 = 13, 2-bit
// codes [1,2,3,0] to 0b00111001 = 57, and 3-bit codes [5,3,7] to 0b11011101, 0b00000001 = 221, 1
// (code 2 straddles the two bytes). For 1, 2, 4 and 8 bits no code straddles a byte: code i is in
// byte i / (8/bits) at bit offset (i mod (8/bits))·bits. numpy reads any width back with
//   s = np.unpackbits(b, bitorder="little")[:count * bits].reshape(count, bits)
//   codes = (s << np.arange(bits)).sum(1)
// pack_codes / unpack_codes are tensor implementations (CPU or CUDA); the *_reference versions
// are plain loops kept beside them as the specification the tests compare against.

#include <ATen/Tensor.h>

#include <cstdint>

namespace whittle::quantize {

/// Bytes needed for `count` codes of `bits` bits: ceil(count·bits / 8).
int64_t packed_size(int64_t count, int64_t bits);

/// Packs `codes` (any shape, any integer or integral-valued float dtype, values in [0, 2^bits)) in
/// flat (C-contiguous) order into a 1-D uint8 tensor of packed_size(numel, bits) bytes on the same
/// device. Throws whittle::Error for bits outside 1..8 or a code out of range.
at::Tensor pack_codes(const at::Tensor& codes, int64_t bits);

/// Unpacks the first `count` codes from 1-D uint8 `bytes` into a 1-D uint8 tensor [count] on the
/// same device. Throws whittle::Error for bits outside 1..8, a non-uint8 or non-1-D input,
/// or a byte count different from packed_size(count, bits).
at::Tensor unpack_codes(const at::Tensor& bytes, int64_t bits, int64_t count);

/// Plain-loop reference of pack_codes (CPU, same layout); same errors.
at::Tensor pack_codes_reference(const at::Tensor& codes, int64_t bits);
/// Plain-loop reference of unpack_codes (CPU, same layout); same errors.
at::Tensor unpack_codes_reference(const at::Tensor& bytes, int64_t bits, int64_t count);

}  // namespace whittle::quantize
