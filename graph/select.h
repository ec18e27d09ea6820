#pragma once
// Selecting nodes by the `targets` / `ignore` patterns that recipes and passes use.

#include <string>
#include <vector>

#include "graph/graph.h"

namespace whittle {

/// Does node `n` match `pattern`? A pattern is an exact node name ("layer1.0.conv1"), an op kind
/// ("conv2d"), or a regular expression "re:<ECMAScript regex>" matched against the whole node name
/// ("re:layer[12]\\..*").
/// Throws whittle::Error for an invalid regular expression, naming it.
bool node_matches(const Node& n, const std::string& pattern);

/// "" when `pattern` can be matched, else what is wrong with it: an invalid regular expression
/// ("invalid regular expression 're:(': ..."). Throws nothing.
std::string pattern_problem(const std::string& pattern);

/// Whether any node of `graph` matches `pattern` (node_matches). Throws whittle::Error for an
/// invalid regular expression.
bool matches_any_node(const Graph& graph, const std::string& pattern);

/// Throws whittle::Error (kUsage) for the first of `patterns` that matches no node of `graph`:
/// "<what> pattern 'P' matches no node of the model (node names, op kinds <the graph's>, or
/// re:<regex>; ...)", so that a misspelled target or ignore entry does not pass silently; and for an
/// invalid regular expression. `what` names the list ("target", "ignore").
void require_matches(const Graph& graph, const std::vector<std::string>& patterns, const std::string& what);

/// Nodes matching any of `targets` and none of `ignore`, in graph order. Empty `targets` select
/// every node. Throws whittle::Error when a target pattern that is a plain name (not an op kind,
/// not a regex) matches no node, naming the pattern, so that typos do not pass silently.
std::vector<std::string> select_nodes(const Graph& graph, const std::vector<std::string>& targets,
                                      const std::vector<std::string>& ignore);

}  // namespace whittle
