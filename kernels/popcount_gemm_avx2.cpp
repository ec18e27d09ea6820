// AVX2 popcount GEMM (kernels/popcount_gemm.h): compiled with -mavx2 -mpopcnt.
//
// A 2×4 block of C keeps 8 accumulators of 32 byte counts. Each step combines 4 words of a row of
// A with 4 words of a row of B and adds the byte popcounts, looked up per nibble with vpshufb
// (Muła's method). A byte count grows by at most 8 a step, so every 31 steps the bytes are summed
// into 64-bit totals with vpsadbw before they can overflow. The last K mod 4 words use popcnt.

#include <immintrin.h>

#include "kernels/popcount_gemm.h"

namespace whittle::kernels::detail {
namespace {

template <BitOp Op>
inline __m256i combine(__m256i a, __m256i b) {
  if constexpr (Op == BitOp::kXor) return _mm256_xor_si256(a, b);
  else return _mm256_and_si256(a, b);
}

template <BitOp Op>
inline uint64_t combine(uint64_t a, uint64_t b) {
  if constexpr (Op == BitOp::kXor) return a ^ b;
  else return a & b;
}

inline int64_t sum_bytes(__m256i v) {
  const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
  return _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) + _mm256_extract_epi64(s, 2) +
         _mm256_extract_epi64(s, 3);
}

template <BitOp Op, int MR, int NR>
void block(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t K, int32_t* C, int64_t ldc) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2,
                                       3, 2, 3, 3, 4);
  const __m256i low = _mm256_set1_epi8(0x0f);
  int64_t total[MR][NR] = {};
  const int64_t vector_words = K / 4 * 4;
  for (int64_t k0 = 0; k0 < vector_words; k0 += 31 * 4) {
    const int64_t k1 = k0 + 31 * 4 < vector_words ? k0 + 31 * 4 : vector_words;
    __m256i acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 4) {
      __m256i a[MR];
      for (int r = 0; r < MR; ++r) a[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A + r * lda + k));
      for (int c = 0; c < NR; ++c) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + c * ldb + k));
        for (int r = 0; r < MR; ++r) {
          const __m256i x = combine<Op>(a[r], b);
          const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, low));
          const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), low));
          acc[r][c] = _mm256_add_epi8(acc[r][c], _mm256_add_epi8(lo, hi));
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) total[r][c] += sum_bytes(acc[r][c]);
  }
  for (int64_t k = vector_words; k < K; ++k)
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) total[r][c] += _mm_popcnt_u64(combine<Op>(A[r * lda + k], B[c * ldb + k]));
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) C[r * ldc + c] = static_cast<int32_t>(total[r][c]);
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
  for (; i + 2 <= M; i += 2) row_block<Op, 2>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc);
  if (i < M) row_block<Op, 1>(A + i * lda, lda, B, ldb, N, K, C + i * ldc, ldc);
}

}  // namespace

void popcount_gemm_avx2(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                        int64_t N, int64_t K, int32_t* C, int64_t ldc) {
  if (op == BitOp::kXor) gemm<BitOp::kXor>(A, lda, B, ldb, M, N, K, C, ldc);
  else gemm<BitOp::kAnd>(A, lda, B, ldb, M, N, K, C, ldc);
}

}  // namespace whittle::kernels::detail
