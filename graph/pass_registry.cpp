#include "graph/pass_registry.h"

#include "core/error.h"

namespace whittle {

Registry<PassInfo>& passes() {
  static Registry<PassInfo> r("pass", "passes", [](const PassInfo& p) { return p.description; });
  return r;
}

void register_pass(PassInfo info) {
  if (info.name.empty() || !info.run) throw Error("register_pass: needs a name and a function");
  const std::string name = info.name;
  passes().add(name, std::move(info));
}

const PassInfo& pass_info(const std::string& name) { return passes().get(name); }

std::vector<std::string> pass_names() { return passes().names(); }

std::string run_pass(const std::string& name, Graph& graph, const PassCall& call) {
  return pass_info(name).run(graph, call);
}

std::string run_pass(const std::string& name, Graph& graph, const Settings& settings) {
  return run_pass(name, graph, PassCall{settings, OptionSource{"pass '" + name + "'"}});
}

}  // namespace whittle
