#include "runner/pass_modifier.h"


#include <algorithm>
#include <iostream>

#include "core/error.h"
#include "graph/pass_registry.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// Runs its pass in on_start (before every other modifier's first change when it comes first in the
// recipe), once: the saved graph of a resumed run already holds the rewrite.
class GraphPassModifier : public Modifier {
 public:
  explicit GraphPassModifier(const ModifierSpec& spec) : Modifier(spec) {
    auto refuse = [&](const std::string& why) {
      throw Error(spec.location + ": modifier 'graph_pass': " + why, ErrorKind::kUsage);
    };
    if (!spec.settings.contains("pass")) refuse("key 'pass' is required (one of: " + known() + ")");
    pass_ = spec.settings["pass"].as<std::string>();
    if (!passes().find(pass_)) refuse("key 'pass': '" + pass_ + "' is not a registered pass (" + known() + ")");
    // A pass that has a modifier of its own (quantize, prune) also works during training there
    // (latent weight clips, schedules, fine-tuning windows): one graph rewrite would drop that.
    if (modifiers().find(pass_))
      refuse("key 'pass': '" + pass_ + "' has its modifier of the same name, which also does its work during training: "
             "use `- {name: " + pass_ + ", ...}`");
    if (spec.start_epoch > 0 || spec.end_epoch >= 0)
      refuse("the pass runs once before training: leave start_epoch and end_epoch out");
    const PassInfo& info = pass_info(pass_);
    auto has = [&](const std::string& key) {
      return std::any_of(info.options.begin(), info.options.end(), [&](const KeySpec& k) { return k.name == key; });
    };
    for (const auto& [key, value] : spec.settings.values()) {
      if (key == "pass") continue;
      if (!has(key)) {
        std::string keys;
        for (const KeySpec& k : info.options) keys += (keys.empty() ? "" : ", ") + k.name;
        refuse("key '" + key + "' is not an option of pass '" + pass_ + "' (" + (keys.empty() ? "none" : keys) + ")");
      }
      settings_[key] = value;
    }
    for (const auto& [key, patterns] : {std::pair{"targets", spec.targets}, std::pair{"ignore", spec.ignore}}) {
      if (patterns.empty()) continue;
      if (!has(key)) refuse("pass '" + pass_ + "' takes no " + key);
      settings_[key] = patterns;
    }
  }

  void on_start(TrainContext& tc) override {
    if (applied_) return;
    const std::string where = spec().location + ": modifier 'graph_pass'";
    const PassCall call{settings_, OptionSource{where, KeyStyle::kRecipe}};
    std::string report;
    try {
      report = run_pass(pass_, tc.model->graph(), call);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind(where, 0) == 0) throw;  // names the entry already (a bad option)
      throw Error(where + ": " + what, e.kind());
    }
    tc.model->sync();
    tc.parameters_changed = true;
    applied_ = true;
    *tc.log << "graph_pass (" << pass_ << "): " << report << std::flush;
  }
  // A rewrite of the model: as useful in a run of 0 epochs as in training.
  std::string needs_training() const override { return ""; }

  std::string state() const override { return applied_state(applied_); }
  void load_state(const std::string& text) override {
    applied_ = parse_applied_state(text, spec().location + ": modifier 'graph_pass'");
  }

 private:
  static std::string known() {
    std::string all;
    for (const auto& n : pass_names()) all += (all.empty() ? "" : ", ") + n;
    return all;
  }

  std::string pass_;
  Settings settings_;
  bool applied_ = false;
};

// `pass` and every registered pass's options (each once, with the passes that have it).
std::vector<KeySpec> graph_pass_keys() {
  std::vector<KeySpec> keys = {KeySpec{"pass", KeyType::kString, "required", "the registered pass to run (whittle inspect --passes)", {}, {}, {}}};
  for (const auto& name : pass_names())
    for (const KeySpec& k : pass_info(name).options) {
      if (k.name == "targets" || k.name == "ignore") continue;  // the entry's own keys
      auto it = std::find_if(keys.begin(), keys.end(), [&](const KeySpec& e) { return e.name == k.name; });
      if (it == keys.end()) {
        KeySpec copy = k;
        copy.description = name + ": " + k.description;
        keys.push_back(copy);
      } else {
        it->description += "; " + name + ": " + k.description;
      }
    }
  return keys;
}

}  // namespace

void register_graph_pass_modifier() {
  ModifierInfo info;
  info.name = "graph_pass";
  info.description = "runs a registered graph pass on the model once, before training (e.g. bireal_shortcuts)";
  info.settings_now = &graph_pass_keys;
  info.create = [](const ModifierSpec& spec) { return std::make_unique<GraphPassModifier>(spec); };
  info.label = [](const ModifierSpec& spec) {
    return spec.settings.contains("pass") ? spec.settings["pass"].text() : std::string("graph_pass");
  };
  register_modifier(std::move(info));
}

}  // namespace whittle::runner
