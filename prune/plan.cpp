// Planning: which channels of which groups go, for a sparsity or a MACs / parameter target.

#include <algorithm>
#include <map>
#include <optional>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.h"
#include "graph/select.h"
#include "prune/prune.h"

namespace whittle::prune {

namespace {

[[noreturn]] void usage(const std::string& msg) { throw Error("prune: " + msg, ErrorKind::kUsage); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

struct Scored {
  std::vector<DependencyGroup> groups;
  std::vector<std::vector<double>> scores;
  std::vector<bool> targeted;
  std::vector<std::string> skipped;
};

Scored score_all(const Graph& graph, const Config& c) {
  Scored s;
  s.groups = dependency_groups(graph);
  // A group is pruned when one of its producers is a target (the others are coupled to it: their
  // channels go together) and none is ignored.
  const std::vector<std::string> target_list = select_nodes(graph, c.targets, {});
  const std::set<std::string> targets(target_list.begin(), target_list.end());
  std::set<std::string> ignored;  // matched as select_nodes matches its ignore list: no pattern need match
  for (const Node& n : graph.nodes())
    for (const auto& pattern : c.ignore)
      if (node_matches(n, pattern)) ignored.insert(n.name);
  for (const auto& g : s.groups) {
    const std::vector<std::string> producers = g.producers();
    std::string why;
    if (g.prunable() == 0) why = "fixed: " + g.fixed_reason;
    else if (producers.empty()) why = "no layer produces these channels";
    else if (g.channels <= c.min_channels) why = "already at min_channels " + std::to_string(c.min_channels);
    else if (std::none_of(producers.begin(), producers.end(), [&](const std::string& p) { return targets.count(p) > 0; }))
      why = producers.size() == 1 ? "layer '" + producers[0] + "' is not among the targets"
                                  : "none of its layers is among the targets";
    else
      for (const auto& p : producers)
        if (ignored.count(p)) {
          why = "layer '" + p + "' is ignored";
          break;
        }
    std::vector<double> scores = why.empty() ? score(graph, g, c.scoring) : std::vector<double>(static_cast<size_t>(g.channels), 0.0);
    // Network slimming ranks by a normalization's γ: a group without one has no ranking (every score
    // infinite), and removing its channels would pick them arbitrarily.
    if (why.empty() && c.scoring.criterion == Criterion::kBnScale &&
        std::all_of(scores.begin(), scores.end(), [](double v) { return std::isinf(v); }))
      why = "no normalization (batch_norm γ) to rank its channels by (criterion bn_scale)";
    s.targeted.push_back(why.empty());
    if (!why.empty())
      s.skipped.push_back("group " + std::to_string(g.id) + (producers.empty() ? "" : " (" + join(producers) + ")") + ": " + why);
    s.scores.push_back(std::move(scores));
  }
  return s;
}

// For a group whose channels are several layers' outputs side by side (a concatenation), the index
// of the layer producing each channel (0, 1, ... in order of first appearance); empty when a
// channel has no producer or more than one (a residual add: every member carries all of them), or
// when one layer produces them all.
std::vector<int64_t> channel_owners(const DependencyGroup& g, std::vector<std::string>* owner_layers = nullptr) {
  const size_t channels = static_cast<size_t>(g.channels);
  std::vector<int64_t> owner(channels, -1);
  std::vector<std::string> layers;
  for (const Member& m : g.members) {
    if (m.role != ChannelRole::kOutput) continue;
    int64_t index = -1;
    for (size_t k = 0; k < channels; ++k) {
      if (m.positions[k].empty()) continue;
      if (owner[k] >= 0) return {};  // two producers of one channel
      if (index < 0) {
        index = static_cast<int64_t>(layers.size());
        layers.push_back(m.node);
      }
      owner[k] = index;
    }
  }
  if (layers.size() < 2 || std::find(owner.begin(), owner.end(), -1) != owner.end()) return {};
  if (owner_layers) *owner_layers = layers;
  return owner;
}

// The group's channel count before any pruning when `original` (layer → output channels) knows it:
// the sum over a concatenation's layers, else its first producer's width (a residual group's
// producers all have the group's width).
std::optional<int64_t> original_group_channels(const DependencyGroup& g, const std::map<std::string, int64_t>& original) {
  std::vector<std::string> layers;
  if (!channel_owners(g, &layers).empty()) {
    int64_t sum = 0;
    for (const auto& l : layers) {
      auto it = original.find(l);
      if (it == original.end()) return std::nullopt;
      sum += it->second;
    }
    return sum;
  }
  const std::vector<std::string> producers = g.producers();
  auto it = producers.empty() ? original.end() : original.find(producers.front());
  if (it == original.end()) return std::nullopt;
  return it->second;
}

// The `n_remove` lowest-scored free channels of group `g`, adjusted so that the kept count is at
// least min_channels and a multiple of lcm(round_to, segments), with equal counts per segment.
std::vector<int64_t> choose(const DependencyGroup& g, const std::vector<double>& sc, int64_t n_remove, const Config& c) {
  const int64_t channels = g.channels;
  const int64_t unit = std::lcm(std::max<int64_t>(c.round_to, 1), std::max<int64_t>(g.segments, 1));
  int64_t kept = std::max(channels - n_remove, std::max<int64_t>(c.min_channels, 1));
  kept = (kept + unit - 1) / unit * unit;
  if (kept >= channels || n_remove <= 0) return {};
  std::vector<int64_t> out;
  if (g.segments > 1) {
    if (channels % g.segments != 0) return {};
    const int64_t per_keep = kept / g.segments;
    for (int64_t s = 0; s < g.segments; ++s) {
      std::vector<int64_t> members;
      for (int64_t k = 0; k < channels; ++k)
        if (g.segment[static_cast<size_t>(k)] == s) members.push_back(k);
      std::vector<int64_t> free;
      for (int64_t k : members)
        if (!g.fixed[static_cast<size_t>(k)]) free.push_back(k);
      const int64_t drop = static_cast<int64_t>(members.size()) - per_keep;
      if (drop <= 0) continue;
      if (drop > static_cast<int64_t>(free.size())) return {};  // fixed channels leave too few to equalize
      std::stable_sort(free.begin(), free.end(), [&](int64_t a, int64_t b) { return sc[static_cast<size_t>(a)] < sc[static_cast<size_t>(b)]; });
      out.insert(out.end(), free.begin(), free.begin() + drop);
    }
  } else {
    std::vector<int64_t> free;
    for (int64_t k = 0; k < channels; ++k)
      if (!g.fixed[static_cast<size_t>(k)]) free.push_back(k);
    int64_t drop = std::min<int64_t>(channels - kept, static_cast<int64_t>(free.size()));
    while (drop > 0 && (channels - drop) % unit != 0) --drop;
    auto lowest_first = [&](int64_t a, int64_t b) { return sc[static_cast<size_t>(a)] < sc[static_cast<size_t>(b)]; };
    const std::vector<int64_t> owner = c.rank_per_layer ? channel_owners(g) : std::vector<int64_t>{};
    if (owner.empty()) {
      std::stable_sort(free.begin(), free.end(), lowest_first);
      out.assign(free.begin(), free.begin() + drop);
    } else {
      // A concatenation: each layer gives its share of `drop` (largest remainders first), its
      // lowest-scored free channels.
      const int64_t layers = *std::max_element(owner.begin(), owner.end()) + 1;
      std::vector<std::vector<int64_t>> free_of(static_cast<size_t>(layers));
      std::vector<int64_t> size_of(static_cast<size_t>(layers), 0);
      for (int64_t k = 0; k < channels; ++k) ++size_of[static_cast<size_t>(owner[static_cast<size_t>(k)])];
      for (int64_t k : free)  // unranked channels (an infinite score: no BN γ for bn_scale) stay
        if (std::isfinite(sc[static_cast<size_t>(k)])) free_of[static_cast<size_t>(owner[static_cast<size_t>(k)])].push_back(k);
      std::vector<int64_t> share(static_cast<size_t>(layers));
      std::vector<std::pair<double, int64_t>> remainder;
      int64_t given = 0;
      for (int64_t l = 0; l < layers; ++l) {
        const double exact = static_cast<double>(drop) * static_cast<double>(size_of[static_cast<size_t>(l)]) /
                             static_cast<double>(channels);
        share[static_cast<size_t>(l)] = std::min<int64_t>(static_cast<int64_t>(std::floor(exact + 1e-9)),
                                                          static_cast<int64_t>(free_of[static_cast<size_t>(l)].size()));
        given += share[static_cast<size_t>(l)];
        remainder.emplace_back(exact - static_cast<double>(share[static_cast<size_t>(l)]), l);
      }
      std::stable_sort(remainder.begin(), remainder.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (bool more = true; given < drop && more;) {  // what rounding left, where it fits
        more = false;
        for (const auto& [r, l] : remainder) {
          if (given >= drop) break;
          if (share[static_cast<size_t>(l)] < static_cast<int64_t>(free_of[static_cast<size_t>(l)].size())) {
            ++share[static_cast<size_t>(l)];
            ++given;
            more = true;
          }
        }
      }
      for (int64_t l = 0; l < layers; ++l) {
        std::vector<int64_t>& f = free_of[static_cast<size_t>(l)];
        std::stable_sort(f.begin(), f.end(), lowest_first);
        out.insert(out.end(), f.begin(), f.begin() + share[static_cast<size_t>(l)]);
      }
      std::sort(out.begin(), out.end());
    }
  }
  // Every member keeps min_channels of the channels it carries (a group can span several layers'
  // outputs, as a DenseNet block's concatenation does): the member's highest-scored removed
  // channels come back where it would keep fewer.
  std::vector<bool> removed(static_cast<size_t>(channels), false);
  for (int64_t k : out) removed[static_cast<size_t>(k)] = true;
  for (const Member& m : g.members) {
    std::vector<int64_t> carried, gone;
    for (int64_t k = 0; k < channels; ++k) {
      if (m.positions[static_cast<size_t>(k)].empty()) continue;
      carried.push_back(k);
      if (removed[static_cast<size_t>(k)]) gone.push_back(k);
    }
    const int64_t floor_keep = std::min<int64_t>(std::max<int64_t>(c.min_channels, 1), static_cast<int64_t>(carried.size()));
    int64_t kept = static_cast<int64_t>(carried.size() - gone.size());
    std::stable_sort(gone.begin(), gone.end(), [&](int64_t a, int64_t b) { return sc[static_cast<size_t>(a)] > sc[static_cast<size_t>(b)]; });
    for (size_t i = 0; kept < floor_keep && i < gone.size(); ++i, ++kept) removed[static_cast<size_t>(gone[i])] = false;
  }
  out.clear();
  for (int64_t k = 0; k < channels; ++k)
    if (removed[static_cast<size_t>(k)]) out.push_back(k);
  return out;
}

Plan plan_at(const Scored& s, double sparsity, const Config& c) {
  Plan p;
  p.groups = s.groups;
  p.skipped = s.skipped;
  p.remove.assign(s.groups.size(), {});
  if (!c.global) {
    for (size_t i = 0; i < s.groups.size(); ++i) {
      if (!s.targeted[i]) continue;
      const DependencyGroup& g = s.groups[i];
      int64_t n = static_cast<int64_t>(std::floor(sparsity * static_cast<double>(g.channels) + 1e-9));
      if (const std::optional<int64_t> c0 = original_group_channels(g, c.original_channels))
        n = g.channels - (*c0 - static_cast<int64_t>(std::floor(sparsity * static_cast<double>(*c0) + 1e-9)));
      p.remove[i] = choose(g, s.scores[i], n, c);
    }
    return p;
  }
  // Global: every targeted free channel ranked by its score over its group's mean score.
  struct Candidate {
    double score;
    size_t group;
  };
  std::vector<Candidate> all;
  int64_t total = 0;
  for (size_t i = 0; i < s.groups.size(); ++i) {
    if (!s.targeted[i]) continue;
    total += s.groups[i].channels;
    double sum = 0;
    int64_t n = 0;
    for (size_t k = 0; k < s.scores[i].size(); ++k)
      if (!s.groups[i].fixed[k] && std::isfinite(s.scores[i][k])) sum += s.scores[i][k], ++n;
    const double mean = n > 0 && sum > 0 ? sum / static_cast<double>(n) : 1.0;
    for (size_t k = 0; k < s.scores[i].size(); ++k)
      if (!s.groups[i].fixed[k] && std::isfinite(s.scores[i][k])) all.push_back({s.scores[i][k] / mean, i});
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) { return a.score < b.score; });
  const auto want = static_cast<int64_t>(std::floor(sparsity * static_cast<double>(total) + 1e-9));
  std::vector<int64_t> count(s.groups.size(), 0);
  int64_t taken = 0;
  for (const Candidate& cand : all) {
    if (taken >= want) break;
    const DependencyGroup& g = s.groups[cand.group];
    if (g.channels - count[cand.group] - 1 < c.min_channels) continue;
    ++count[cand.group];
    ++taken;
  }
  for (size_t i = 0; i < s.groups.size(); ++i)
    if (s.targeted[i] && count[i] > 0) p.remove[i] = choose(s.groups[i], s.scores[i], count[i], c);
  return p;
}

NodeCost cost_after(const Graph& graph, const Plan& plan) {
  Graph trial = graph.clone(/*clone_tensors=*/false);
  remove_channels(trial, plan, /*fold_constant_outputs=*/false);
  return graph_cost(trial);
}

}  // namespace

int64_t Plan::removed() const {
  int64_t n = 0;
  for (const auto& r : remove) n += static_cast<int64_t>(r.size());
  return n;
}

std::string why_nothing_removed(const Plan& plan, const Config& c, const OptionSource& src) {
  std::string why;
  for (const auto& s : plan.skipped) why += (why.empty() ? "" : "; ") + s;
  const size_t left = plan.groups.size() - plan.skipped.size();
  if (left > 0)
    why += (why.empty() ? "" : "; ") + std::to_string(left) + " group(s) keep every channel with these amounts (" +
           src.key("round_to") + " " + std::to_string(c.round_to) + ", " + src.key("min_channels") + " " +
           std::to_string(c.min_channels) + ")";
  return why.empty() ? "the model has no prunable group" : why;
}

Plan make_plan(const Graph& graph, const Config& c) {
  if (!(c.sparsity >= 0 && c.sparsity < 1)) usage("sparsity must be in [0, 1), got " + std::to_string(c.sparsity));
  for (const auto& [name, v] : {std::pair<const char*, double>{"target_macs", c.target_macs}, {"target_params", c.target_params}})
    if (!(v == 0 || (v > 0 && v <= 1))) usage(std::string(name) + " must be in (0, 1] (0: none), got " + std::to_string(v));
  if (c.target_macs > 0 && c.target_params > 0) usage("give target_macs or target_params, not both");
  if (c.round_to < 1) usage("round_to must be ≥ 1");
  if (c.min_channels < 1) usage("min_channels must be ≥ 1");
  const Scored s = score_all(graph, c);
  if (c.target_macs == 0 && c.target_params == 0) return plan_at(s, c.sparsity, c);

  const NodeCost base = graph_cost(graph);
  const bool macs = c.target_macs > 0;
  const double goal = (macs ? c.target_macs : c.target_params) * static_cast<double>(macs ? base.macs : base.params);
  auto cost = [&](double sparsity) {
    const NodeCost k = cost_after(graph, plan_at(s, sparsity, c));
    return static_cast<double>(macs ? k.macs : k.params);
  };
  if (cost(0.0) <= goal) return plan_at(s, 0.0, c);
  double lo = 0.0, hi = 0.999;
  const double most = cost(hi);
  if (most > goal) {
    std::ostringstream os;
    os << (macs ? "target_macs " : "target_params ") << (macs ? c.target_macs : c.target_params)
       << " cannot be reached: removing every prunable channel the constraints allow keeps "
       << most / static_cast<double>(macs ? base.macs : base.params) << " of the " << (macs ? "MACs" : "parameters");
    usage(os.str());
  }
  for (int it = 0; it < 30; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (cost(mid) <= goal) hi = mid;
    else lo = mid;
  }
  Plan best = plan_at(s, hi, c);
  // The same fraction in every group moves in steps (round_to, min_channels, small layers): fill
  // the gap to the target by giving channels back, a rounding unit at a time, to the groups whose
  // removed channels score highest, while the cost stays within the target.
  auto plan_cost = [&](const Plan& p) {
    const NodeCost k = cost_after(graph, p);
    return static_cast<double>(macs ? k.macs : k.params);
  };
  double current = plan_cost(best);
  for (int evaluations = 0, changed = 1; changed && evaluations < 400;) {
    changed = 0;
    std::vector<size_t> order;
    for (size_t i = 0; i < best.remove.size(); ++i)
      if (!best.remove[i].empty() && s.groups[i].segments == 1) order.push_back(i);
    auto top_removed = [&](size_t i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k : best.remove[i]) m = std::max(m, s.scores[i][static_cast<size_t>(k)]);
      return m;
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return top_removed(a) > top_removed(b); });
    for (size_t i : order) {
      const int64_t unit = std::max<int64_t>(c.round_to, 1);
      std::vector<int64_t> rm = best.remove[i];
      if (static_cast<int64_t>(rm.size()) < unit) continue;
      std::stable_sort(rm.begin(), rm.end(), [&](int64_t a, int64_t b) { return s.scores[i][static_cast<size_t>(a)] > s.scores[i][static_cast<size_t>(b)]; });
      rm.erase(rm.begin(), rm.begin() + unit);  // give back the best `unit` removed channels
      std::sort(rm.begin(), rm.end());
      Plan trial = best;
      trial.remove[i] = rm;
      ++evaluations;
      const double k = plan_cost(trial);
      if (k <= goal && k > current) {
        best = std::move(trial);
        current = k;
        changed = 1;
      }
    }
  }
  return best;
}

}  // namespace whittle::prune
