// The popcount microkernel of the active instruction set (core/isa.h).
#include "kernels/isa.h"
#include "kernels/popcount_gemm.h"

namespace whittle::kernels::detail {

PopcountGemmFn popcount_gemm() {
  switch (active_isa()) {
#if defined(WHITTLE_KERNELS_X86)
    case Isa::kAvx512: return popcount_gemm_avx512;
    case Isa::kAvx2: return popcount_gemm_avx2;
#endif
    default: return popcount_gemm_scalar;
  }
}

}  // namespace whittle::kernels::detail
