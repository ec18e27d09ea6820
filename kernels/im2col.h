#pragma once
// The gathering step shared by the packed convolutions (binary_conv.cpp, bitplane.cpp).

#include <cstdint>

#include "kernels/binary_conv.h"

namespace whittle::kernels::detail {

/// Gathers, for each of the Wo positions of output row (n, oh), its K = KH·KW·Cw input words in
/// tap order (kh, kw), from packed NHWC words x [N, H, W, Cw], into dst [Wo, K]; taps outside the
/// input read zero words (the padding).
void gather_row(const uint64_t* x, int64_t H, int64_t W, int64_t Cw, int64_t KH, int64_t KW,
                const BinaryConv2dOptions& opt, int64_t n, int64_t oh, int64_t Wo, uint64_t* dst);

}  // namespace whittle::kernels::detail
