// AVX-512 popcount GEMM (kernels/popcount_gemm.h): compiled with -mavx512f -mavx512vpopcntdq.
//
// Outer-product form: a block of MR ≤ 4 rows × NV ≤ 4 vectors of 8 output channels keeps MR·NV
// accumulators of 8 × 64-bit counts, one lane per output channel. Each step k broadcasts word k of
// each row of A, loads word k of 8·NV consecutive columns of B, combines and adds vpopcntq. No
// horizontal sums: the lanes are the outputs, narrowed to int32 on the store. The last columns
// (N mod 8) use masked loads and stores.

#include <immintrin.h>

#include "kernels/popcount_gemm.h"

#include <algorithm>

namespace whittle::kernels::detail {
namespace {

template <BitOp Op>
inline __m512i combine(__m512i a, __m512i b) {
  if constexpr (Op == BitOp::kXor) return _mm512_xor_si512(a, b);
  else return _mm512_and_si512(a, b);
}

// Block of MR rows × NV vectors; the last vector keeps only the lanes in `last` (mask).
template <BitOp Op, int MR, int NV>
void block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t K, int32_t* C, int64_t ldc,
           __mmask8 last) {
  __m512i acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; ++k) {
    __m512i b[NV];
    for (int v = 0; v < NV; ++v)
      b[v] = v + 1 < NV ? _mm512_loadu_si512(B + k * ldb + 8 * v) : _mm512_maskz_loadu_epi64(last, B + k * ldb + 8 * v);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi64(static_cast<long long>(A[r * lda + k]));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_add_epi64(acc[r][v], _mm512_popcnt_epi64(combine<Op>(a, b[v])));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      _mm512_mask_cvtepi64_storeu_epi32(C + r * ldc + 8 * v, v + 1 < NV ? __mmask8(0xff) : last, acc[r][v]);
}

// Every row of A against one block of NV vectors of columns.
template <BitOp Op, int NV>
void column_block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M, int64_t K, int32_t* C,
                  int64_t ldc, __mmask8 last) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) block<Op, 4, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last);
  switch (M - i) {
    case 3: block<Op, 3, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    case 2: block<Op, 2, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    case 1: block<Op, 1, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    default: break;
  }
}

// Column blocks outside, rows inside: a block of B (K × 32 words; in L1 while K·256 bytes fit,
// 9 KB for 256 channels 3×3) is reused by every row of A (one output row of a convolution).
template <BitOp Op>
void gemm(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M, int64_t N, int64_t K, int32_t* C,
          int64_t ldc) {
  int64_t j = 0;
  for (; j + 32 <= N; j += 32) column_block<Op, 4>(A, lda, B + j, ldb, M, K, C + j, ldc, 0xff);
  const int64_t rest = N - j;
  if (rest == 0) return;
  const __mmask8 last = static_cast<__mmask8>(rest % 8 == 0 ? 0xff : (1u << (rest % 8)) - 1u);
  switch ((rest + 7) / 8) {
    case 4: column_block<Op, 4>(A, lda, B + j, ldb, M, K, C + j, ldc, last); break;
    case 3: column_block<Op, 3>(A, lda, B + j, ldb, M, K, C + j, ldc, last); break;
    case 2: column_block<Op, 2>(A, lda, B + j, ldb, M, K, C + j, ldc, last); break;
    default: column_block<Op, 1>(A, lda, B + j, ldb, M, K, C + j, ldc, last); break;
  }
}

}  // namespace

void popcount_gemm_avx512(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                          int64_t N, int64_t K, int32_t* C, int64_t ldc) {
  // Empty operands may come as null pointers, which the blocks below must not offset (UBSan).
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0);
    return;
  }
  if (op == BitOp::kXor) gemm<BitOp::kXor>(A, lda, B, ldb, M, N, K, C, ldc);
  else gemm<BitOp::kAnd>(A, lda, B, ldb, M, N, K, C, ldc);
}

}  // namespace whittle::kernels::detail
