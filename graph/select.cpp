#include "graph/select.h"

#include <regex>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle {

namespace {

bool is_regex(const std::string& p) { return p.rfind("re:", 0) == 0; }

std::regex compile(const std::string& pattern) {
  try {
    return std::regex(pattern.substr(3), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw Error("invalid regular expression '" + pattern + "': " + e.what());
  }
}

}  // namespace

bool node_matches(const Node& n, const std::string& pattern) {
  if (is_regex(pattern)) return std::regex_match(n.name, compile(pattern));
  return n.name == pattern || n.op == pattern;
}

std::string pattern_problem(const std::string& pattern) {
  if (!is_regex(pattern)) return "";
  try {
    compile(pattern);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool matches_any_node(const Graph& graph, const std::string& pattern) {
  if (is_regex(pattern)) {
    const std::regex re = compile(pattern);
    for (const auto& n : graph.nodes())
      if (std::regex_match(n.name, re)) return true;
    return false;
  }
  for (const auto& n : graph.nodes())
    if (n.name == pattern || n.op == pattern) return true;
  return false;
}

void require_matches(const Graph& graph, const std::vector<std::string>& patterns, const std::string& what) {
  for (const std::string& p : patterns) {
    bool any = false;
    try {
      any = matches_any_node(graph, p);
    } catch (const Error& e) {
      throw Error(e.what(), ErrorKind::kUsage);
    }
    if (any) continue;
    std::set<std::string> ops;
    for (const auto& n : graph.nodes()) ops.insert(n.op);
    std::string list;
    for (const auto& o : ops) list += (list.empty() ? "" : ", ") + o;
    throw Error(what + " pattern '" + p + "' matches no node of the model (node names, op kinds " + list +
                    ", or re:<regex>; `whittle inspect` lists the nodes)",
                ErrorKind::kUsage);
  }
}

std::vector<std::string> select_nodes(const Graph& graph, const std::vector<std::string>& targets,
                                      const std::vector<std::string>& ignore) {
  for (const auto& t : targets) {
    if (is_regex(t) || has_op(t)) {
      if (is_regex(t)) compile(t);  // report bad regexes even when nothing would match
      continue;
    }
    if (!graph.find_node(t)) {
      std::string msg = "target '" + t + "' is neither a node of the model nor an op kind";
      throw Error(msg + " (use re:<regex> for patterns)");
    }
  }
  for (const auto& t : ignore)
    if (is_regex(t)) compile(t);
  std::vector<std::string> out;
  for (const auto& n : graph.nodes()) {
    bool hit = targets.empty();
    for (const auto& t : targets) hit = hit || node_matches(n, t);
    if (!hit) continue;
    bool skip = false;
    for (const auto& i : ignore) skip = skip || node_matches(n, i);
    if (!skip) out.push_back(n.name);
  }
  return out;
}

}  // namespace whittle
