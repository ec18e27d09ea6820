#pragma once
// The instruction-set variants of whittle's own vectorized loops (the bitpacked kernels of kernels/,
// the fused quantizers of quantize/) and the choice among them at run time.

#include <string>
#include <vector>

namespace whittle {

/// A variant of the vectorized loops (kernels/popcount_gemm.h, quantize/quantize_simd.h).
enum class Isa {
  kScalar,  ///< portable C++ (one 64-bit popcount at a time)
  kAvx2,    ///< AVX2 + POPCNT: nibble-table popcount on 256-bit vectors
  kAvx512,  ///< AVX-512F + AVX512_VPOPCNTDQ: vpopcntq on 512-bit vectors
};

/// "scalar", "avx2" or "avx512".
std::string isa_name(Isa isa);
/// The Isa named "scalar", "avx2" or "avx512". Throws whittle::Error (usage) for another name.
Isa parse_isa(const std::string& name);
/// Whether this CPU runs `isa` (cpuid through __builtin_cpu_supports).
bool isa_supported(Isa isa);
/// Every variant this CPU runs, portable first.
std::vector<Isa> supported_isas();
/// The variant the kernels use: set_isa's, else the environment variable WHITTLE_KERNEL_ISA
/// (read once; an unknown or unsupported name throws whittle::Error naming it), else the best
/// this CPU supports.
Isa active_isa();
/// Makes the vectorized loops use `isa` from now on (all threads). Throws whittle::Error when this CPU does
/// not support it.
void set_isa(Isa isa);

}  // namespace whittle
