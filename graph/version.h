#pragma once
// Version information of whittle and of the LibTorch it was built with.

#include <string>

namespace whittle {

/// whittle's version, "MAJOR.MINOR.PATCH".
std::string version();
/// The git revision whittle was built from ("unknown" outside a git checkout).
std::string git_revision();
/// The LibTorch version whittle was compiled against, e.g. "2.11.0".
std::string torch_version();
/// True when whittle was built with WHITTLE_CUDA (CUDA code paths and tests).
bool built_with_cuda();
/// The instruction set ATen's CPU kernels dispatch to on this machine ("DEFAULT", "AVX2",
/// "AVX512", ...; ATEN_CPU_CAPABILITY overrides it). Float results of training depend on it.
std::string cpu_capability();
/// ATen's intra-op thread count in this process (at::get_num_threads(): OMP_NUM_THREADS, or
/// training.threads once a run set it). Float results of training depend on it too.
int intra_op_threads();

}  // namespace whittle
