#include "runner/modifier.h"

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>

#include "core/error.h"
#include "core/registration.h"
#include "runner/distill_modifier.h"
#include "runner/fuse_modifier.h"
#include "runner/pass_modifier.h"
#include "runner/prune_modifier.h"
#include "runner/quantize_modifier.h"

namespace whittle::runner {

Registry<ModifierInfo>& modifiers() {
  static Registry<ModifierInfo> r("modifier", "modifiers", [](const ModifierInfo& m) { return m.description; });
  return r;
}

void register_modifier(ModifierInfo info) {
  if (info.name.empty() || !info.create) throw Error("register_modifier: a modifier needs a name and a factory");
  const std::string name = info.name;
  modifiers().add(name, std::move(info));
}

const ModifierInfo& modifier_info(const std::string& name) { return modifiers().get(name); }

std::vector<std::string> modifier_names() { return modifiers().names(); }

std::string modifier_label(const ModifierSpec& spec) {
  const ModifierInfo& info = modifier_info(spec.name);
  return info.label ? info.label(spec) : spec.name;
}

std::vector<KeySpec> modifier_settings(const ModifierInfo& info) {
  return info.settings_now ? info.settings_now() : info.settings;
}

std::string applied_state(bool applied) { return nlohmann::json{{"applied", applied}}.dump(); }

bool parse_applied_state(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text).at("applied").get<bool>();
  } catch (const std::exception& e) {
    throw Error(where + ": unreadable saved state '" + text + "': " + e.what());
  }
}

void register_builtin_modifiers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Each compression module adds its modifiers here as it lands.
    register_quantize_modifier();
    register_fuse_modifier();
    register_prune_modifiers();
    register_distill_modifier();
    register_graph_pass_modifier();
  });
}

WHITTLE_REGISTER_MODULE("runner", &register_builtin_modifiers)

}  // namespace whittle::runner
