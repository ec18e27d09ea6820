#include "core/isa.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace whittle {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_isa{kUnset};

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_name(isa) == name) return isa;
  throw Error("unknown kernel instruction set '" + name + "' (known: scalar, avx2, avx512)", ErrorKind::kUsage);
}

bool isa_supported(Isa isa) {
#if defined(WHITTLE_X86)
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    case Isa::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa active_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v != kUnset) return static_cast<Isa>(v);
  Isa chosen = best_isa();
  if (const char* env = std::getenv("WHITTLE_KERNEL_ISA"); env && *env) {
    try {
      chosen = parse_isa(env);
    } catch (const Error& e) {
      throw Error(std::string("environment variable WHITTLE_KERNEL_ISA: ") + e.what(), ErrorKind::kUsage);
    }
    if (!isa_supported(chosen))
      throw Error("WHITTLE_KERNEL_ISA=" + std::string(env) + ": this CPU does not support it", ErrorKind::kUsage);
  }
  int expected = kUnset;
  g_isa.compare_exchange_strong(expected, static_cast<int>(chosen));
  return static_cast<Isa>(g_isa.load());
}

void set_isa(Isa isa) {
  if (!isa_supported(isa))
    throw Error("kernel instruction set " + isa_name(isa) + ": this CPU does not support it", ErrorKind::kUsage);
  g_isa.store(static_cast<int>(isa));
}

}  // namespace whittle
