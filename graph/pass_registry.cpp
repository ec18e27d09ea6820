#include "graph/pass_registry.h"

#include <mutex>
#include <sstream>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle {

namespace {

[[noreturn]] void bad_option(const std::string& name, const std::string& value, const char* type) {
  throw Error("pass option " + name + "=" + value + ": expected " + type, ErrorKind::kUsage);
}

}  // namespace

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

std::string run_pass(const std::string& name, Graph& graph, const PassOptionValues& options) {
  const PassInfo& p = pass_info(name);
  for (const auto& kv : options) {
    bool known = false;
    std::string valid;
    for (const auto& o : p.options) {
      known = known || o.name == kv.first;
      valid += (valid.empty() ? "" : ", ") + o.name;
    }
    if (!known)
      throw Error("pass '" + name + "' has no option '" + kv.first + "' (options: " + (valid.empty() ? "none" : valid) + ")",
                  ErrorKind::kUsage);
  }
  return p.run(graph, options);
}

bool pass_option_bool(const PassOptionValues& options, const std::string& name, bool fallback) {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  bad_option(name, it->second, "true or false");
}

int64_t pass_option_int(const PassOptionValues& options, const std::string& name, int64_t fallback) {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  size_t used = 0;
  try {
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  bad_option(name, it->second, "an integer");
}

double pass_option_float(const PassOptionValues& options, const std::string& name, double fallback) {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  size_t used = 0;
  try {
    const double v = std::stod(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  bad_option(name, it->second, "a number");
}

std::string pass_option_string(const PassOptionValues& options, const std::string& name, const std::string& fallback) {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

std::vector<std::string> pass_option_list(const PassOptionValues& options, const std::string& name) {
  std::vector<std::string> out;
  auto it = options.find(name);
  if (it == options.end()) return out;
  std::stringstream ss(it->second);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace whittle
