#include "runner/modifier.h"

#include <map>
#include <mutex>

#include "core/error.h"
#include "core/registration.h"
#include "runner/distill_modifier.h"
#include "runner/fuse_modifier.h"
#include "runner/prune_modifier.h"
#include "runner/quantize_modifier.h"

namespace whittle::runner {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ModifierInfo>& registry() {
  static std::map<std::string, ModifierInfo> r;
  return r;
}
}  // namespace

void register_modifier(ModifierInfo info) {
  if (info.name.empty() || !info.create) throw Error("register_modifier: a modifier needs a name and a factory");
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[info.name] = std::move(info);
}

const ModifierInfo& modifier_info(const std::string& name) {
  ensure_registered();
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& kv : registry()) known += (known.empty() ? "" : ", ") + kv.first;
    throw Error("unknown modifier '" + name + "' (known modifiers: " + (known.empty() ? "none registered" : known) + ")",
                ErrorKind::kUsage);
  }
  return it->second;
}

std::vector<std::string> modifier_names() {
  ensure_registered();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& kv : registry()) out.push_back(kv.first);
  return out;
}

void register_builtin_modifiers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Each compression module adds its modifiers here as it lands.
    register_quantize_modifier();
    register_fuse_modifier();
    register_prune_modifiers();
    register_distill_modifier();
  });
}

WHITTLE_REGISTER_MODULE("runner", &register_builtin_modifiers)

}  // namespace whittle::runner
