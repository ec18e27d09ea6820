#pragma once
// The gathering step shared by the packed convolutions (binary_conv.cpp, bitplane.cpp).

#include <cstdint>
#include <vector>

#include "kernels/binary_conv.h"

namespace whittle::kernels::detail {

/// Gathers, for each of the Wo positions of output row (n, oh), its K = KH·KW·Cw input words in
/// tap order (kh, kw), from packed NHWC words x [N, H, W, Cw], into dst [Wo, K]; taps outside the
/// input read zero words (the padding).
void gather_row(const uint64_t* x, int64_t H, int64_t W, int64_t Cw, int64_t KH, int64_t KW,
                const BinaryConv2dOptions& opt, int64_t n, int64_t oh, int64_t Wo, uint64_t* dst);

/// The input words of each output row of a packed convolution, one per thread: for a 1×1,
/// stride-1, unpadded convolution the row of the map itself (its positions' words are adjacent),
/// else gather_row into a buffer of [Wo, K] words.
class RowInput {
 public:
  RowInput(int64_t H, int64_t W, int64_t Cw, int64_t KH, int64_t KW, const BinaryConv2dOptions& opt, int64_t Wo)
      : H_(H), W_(W), Cw_(Cw), KH_(KH), KW_(KW), Wo_(Wo), opt_(opt),
        direct_(KH * KW == 1 && opt.stride_h == 1 && opt.stride_w == 1 && opt.pad_h == 0 && opt.pad_w == 0),
        cols_(direct_ ? 0 : static_cast<size_t>(Wo * KH * KW * Cw)) {}

  /// The [Wo, KH·KW·Cw] words of output row (n, oh) of the map x [N, H, W, Cw]; valid until the next call.
  const uint64_t* row(const uint64_t* x, int64_t n, int64_t oh) {
    if (direct_) return x + (n * H_ + oh) * W_ * Cw_;
    gather_row(x, H_, W_, Cw_, KH_, KW_, opt_, n, oh, Wo_, cols_.data());
    return cols_.data();
  }

 private:
  int64_t H_, W_, Cw_, KH_, KW_, Wo_;
  BinaryConv2dOptions opt_;
  bool direct_;
  std::vector<uint64_t> cols_;
};

}  // namespace whittle::kernels::detail
