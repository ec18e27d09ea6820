#pragma once
// Popcount GEMM microkernels: the inner loop of every bitpacked kernel in this folder. Plain C++
// with intrinsics, no LibTorch: each instruction-set variant is compiled in its own unit with its
// own target flags (kernels/CMakeLists.txt) and chosen at run time (kernels/isa.h).

#include <cstdint>

namespace whittle::kernels::detail {

/// How two words combine before the popcount.
enum class BitOp {
  kXor,  ///< binary × binary: popcount(a ⊕ b) counts the sign mismatches (dot = K − 2·popcount)
  kAnd,  ///< bit-plane × bit-plane: popcount(a ∧ b) counts the positions where both bits are 1
};

/// C[i·ldc + j] = Σ_{k<K} popcount(op(A[i·lda + k], B[k·ldb + j])) for i < M, j < N.
/// A: M rows of K 64-bit words (row stride lda words: the packed inputs, one row a position);
/// B: K-major, K rows of N words (row stride ldb: the packed weights transposed, one column an
/// output channel), so that a vector holds one word of consecutive output channels and no
/// horizontal sums are needed; C: int32, row stride ldc. Overwrites C. M, N, K ≥ 0; K·64 < 2^31.
using PopcountGemmFn = void (*)(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                                int64_t N, int64_t K, int32_t* C, int64_t ldc);

/// Portable variant (std::popcount-style bit counting, any x86-64 or other CPU).
void popcount_gemm_scalar(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                          int64_t N, int64_t K, int32_t* C, int64_t ldc);
/// AVX2 variant: byte popcounts by nibble table lookup (vpshufb), summed per 64-bit lane with
/// vpsadbw; blocks of 4 rows × 8 columns.
/// Needs AVX2 and POPCNT.
void popcount_gemm_avx2(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                        int64_t N, int64_t K, int32_t* C, int64_t ldc);
/// AVX-512 variant: vpopcntq on 8 words (8 output channels) at a time; blocks of 4 rows × 32 columns. Needs AVX512F and AVX512_VPOPCNTDQ.
void popcount_gemm_avx512(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                          int64_t N, int64_t K, int32_t* C, int64_t ldc);

}  // namespace whittle::kernels::detail

namespace whittle::kernels::detail {
/// The variant kernels/isa.h's active_isa() names.
PopcountGemmFn popcount_gemm();
}  // namespace whittle::kernels::detail
