// AVX-512 popcount GEMM (kernels/popcount_gemm.h): compiled with -mavx512f -mavx512vpopcntdq.
//
// A 4×4 block of C keeps 16 accumulators of 8 × 64-bit counts; each step loads 8 words of 4 rows
// of A and of 4 rows of B (masked loads for the last K mod 8 words, zeros beyond), combines them
// and adds vpopcntq. The 16 accumulators are summed across lanes at the end of the K loop.

#include <immintrin.h>

#include "kernels/popcount_gemm.h"

namespace whittle::kernels::detail {
namespace {

template <BitOp Op>
inline __m512i combine(__m512i a, __m512i b) {
  if constexpr (Op == BitOp::kXor) return _mm512_xor_si512(a, b);
  else return _mm512_and_si512(a, b);
}

// C block [mr × nr] (mr, nr ≤ 4) at rows i, columns j.
template <BitOp Op, int MR, int NR>
void block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t K, int32_t* C, int64_t ldc) {
  __m512i acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m512i b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_loadu_si512(B + c * ldb + k);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_loadu_si512(A + r * lda + k);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_add_epi64(acc[r][c], _mm512_popcnt_epi64(combine<Op>(a, b[c])));
    }
  }
  if (k < K) {
    const __mmask8 m = static_cast<__mmask8>((1u << (K - k)) - 1u);
    __m512i b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_maskz_loadu_epi64(m, B + c * ldb + k);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_maskz_loadu_epi64(m, A + r * lda + k);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_add_epi64(acc[r][c], _mm512_popcnt_epi64(combine<Op>(a, b[c])));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) C[r * ldc + c] = static_cast<int32_t>(_mm512_reduce_add_epi64(acc[r][c]));
}

template <BitOp Op, int MR>
void row_block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t N, int64_t K, int32_t* C,
               int64_t ldc) {
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) block<Op, MR, 4>(A, lda, B + j * ldb, ldb, K, C + j, ldc);
  switch (N - j) {
    case 3: block<Op, MR, 3>(A, lda, B + j * ldb, ldb, K, C + j, ldc); break;
    case 2: block<Op, MR, 2>(A, lda, B + j * ldb, ldb, K, C + j, ldc); break;
    case 1: block<Op, MR, 1>(A, lda, B + j * ldb, ldb, K, C + j, ldc); break;
    default: break;
  }
}

template <BitOp Op>
void gemm(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M, int64_t N, int64_t K, int32_t* C,
          int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) row_block<Op, 4>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc);
  switch (M - i) {
    case 3: row_block<Op, 3>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc); break;
    case 2: row_block<Op, 2>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc); break;
    case 1: row_block<Op, 1>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc); break;
    default: break;
  }
}

}  // namespace

void popcount_gemm_avx512(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                          int64_t N, int64_t K, int32_t* C, int64_t ldc) {
  if (op == BitOp::kXor) gemm<BitOp::kXor>(A, lda, B, ldb, M, N, K, C, ldc);
  else gemm<BitOp::kAnd>(A, lda, B, ldb, M, N, K, C, ldc);
}

}  // namespace whittle::kernels::detail
