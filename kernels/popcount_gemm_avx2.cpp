// AVX2 popcount GEMM (kernels/popcount_gemm.h): compiled with -mavx2 -mpopcnt.
//
// Outer-product form, as the AVX-512 variant: a block of MR ≤ 4 rows × NV ≤ 2 vectors of 4
// output channels. Each step k broadcasts word k of each row of A, loads word k of the block's
// columns of B, combines them and adds the byte popcounts, looked up per nibble with vpshufb
// (Muła's method), into byte counters. A byte grows by at most 8 a step, so every 31 steps
// vpsadbw sums the bytes of each 64-bit lane (one lane, one output channel) into 64-bit totals.
// The last columns (N mod 4) use masked loads.

#include <immintrin.h>

#include "kernels/popcount_gemm.h"

#include <algorithm>

namespace whittle::kernels::detail {
namespace {

template <BitOp Op>
inline __m256i combine(__m256i a, __m256i b) {
  if constexpr (Op == BitOp::kXor) return _mm256_xor_si256(a, b);
  else return _mm256_and_si256(a, b);
}

template <BitOp Op, int MR, int NV>
void block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t K, int32_t* C, int64_t ldc,
           int last_lanes) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2,
                                       3, 2, 3, 3, 4);
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
  const __m256i last_mask = _mm256_cmpgt_epi64(_mm256_set1_epi64x(last_lanes), lane);
  __m256i total[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) total[r][v] = _mm256_setzero_si256();
  for (int64_t k0 = 0; k0 < K; k0 += 31) {
    const int64_t k1 = k0 + 31 < K ? k0 + 31 : K;
    __m256i acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; ++k) {
      __m256i b[NV];
      for (int v = 0; v < NV; ++v) {
        const auto* p = reinterpret_cast<const long long*>(B + k * ldb + 4 * v);
        b[v] = v + 1 < NV || last_lanes == 4 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                             : _mm256_maskload_epi64(p, last_mask);
      }
      for (int r = 0; r < MR; ++r) {
        const __m256i a = _mm256_set1_epi64x(static_cast<long long>(A[r * lda + k]));
        for (int v = 0; v < NV; ++v) {
          const __m256i x = combine<Op>(a, b[v]);
          const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, low));
          const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), low));
          acc[r][v] = _mm256_add_epi8(acc[r][v], _mm256_add_epi8(lo, hi));
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        total[r][v] = _mm256_add_epi64(total[r][v], _mm256_sad_epu8(acc[r][v], _mm256_setzero_si256()));
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      alignas(32) int64_t t[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(t), total[r][v]);
      const int lanes = v + 1 < NV ? 4 : last_lanes;
      for (int l = 0; l < lanes; ++l) C[r * ldc + 4 * v + l] = static_cast<int32_t>(t[l]);
    }
}

// Every row of A against one block of NV vectors of columns.
template <BitOp Op, int NV>
void column_block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M, int64_t K, int32_t* C,
                  int64_t ldc, int last) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) block<Op, 4, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last);
  switch (M - i) {
    case 3: block<Op, 3, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    case 2: block<Op, 2, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    case 1: block<Op, 1, NV>(A + i * lda, lda, B, ldb, K, C + i * ldc, ldc, last); break;
    default: break;
  }
}

// Column blocks outside, rows inside, as the AVX-512 variant.
template <BitOp Op>
void gemm(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M, int64_t N, int64_t K, int32_t* C,
          int64_t ldc) {
  int64_t j = 0;
  for (; j + 8 <= N; j += 8) column_block<Op, 2>(A, lda, B + j, ldb, M, K, C + j, ldc, 4);
  const int64_t rest = N - j;
  if (rest == 0) return;
  const int last = static_cast<int>(rest % 4 == 0 ? 4 : rest % 4);
  if (rest > 4) column_block<Op, 2>(A, lda, B + j, ldb, M, K, C + j, ldc, last);
  else column_block<Op, 1>(A, lda, B + j, ldb, M, K, C + j, ldc, last);
}

}  // namespace

void popcount_gemm_avx2(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
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
