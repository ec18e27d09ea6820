// Portable popcount GEMM (kernels/popcount_gemm.h).

#include "kernels/popcount_gemm.h"

namespace whittle::kernels::detail {

void popcount_gemm_scalar(BitOp op, const uint64_t* A, int64_t lda, const uint64_t* B, int64_t ldb, int64_t M,
                          int64_t N, int64_t K, int32_t* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    const uint64_t* a = A + i * lda;
    for (int64_t j = 0; j < N; ++j) {
      int64_t count = 0;
      if (op == BitOp::kXor) {
        for (int64_t k = 0; k < K; ++k) count += __builtin_popcountll(a[k] ^ B[k * ldb + j]);
      } else {
        for (int64_t k = 0; k < K; ++k) count += __builtin_popcountll(a[k] & B[k * ldb + j]);
      }
      C[i * ldc + j] = static_cast<int32_t>(count);
    }
  }
}

}  // namespace whittle::kernels::detail
