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

}  // namespace whittle
