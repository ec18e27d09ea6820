#include "prune/groups.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.h"

namespace whittle::prune {

namespace {

// Union-find over channel units, with a fixed flag and its first reason per root.
class Units {
 public:
  int64_t fresh(const std::string& fixed_reason = "") {
    parent_.push_back(static_cast<int64_t>(parent_.size()));
    reason_.push_back(fixed_reason);
    return parent_.back();
  }
  int64_t find(int64_t u) {
    while (parent_[static_cast<size_t>(u)] != u) {
      parent_[static_cast<size_t>(u)] = parent_[static_cast<size_t>(parent_[static_cast<size_t>(u)])];
      u = parent_[static_cast<size_t>(u)];
    }
    return u;
  }
  int64_t unite(int64_t a, int64_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return a;
    if (b < a) std::swap(a, b);
    parent_[static_cast<size_t>(b)] = a;
    if (reason_[static_cast<size_t>(a)].empty()) reason_[static_cast<size_t>(a)] = reason_[static_cast<size_t>(b)];
    return a;
  }
  void fix(int64_t u, const std::string& why) {
    u = find(u);
    if (reason_[static_cast<size_t>(u)].empty()) reason_[static_cast<size_t>(u)] = why;
  }
  const std::string& reason(int64_t u) { return reason_[static_cast<size_t>(find(u))]; }
  size_t size() const { return parent_.size(); }

 private:
  std::vector<int64_t> parent_;
  std::vector<std::string> reason_;
};

// The channels of a value of shape `s` on axis `axis` (0 when the shape has no such axis).
int64_t channel_count(const Shape& s, int64_t axis) {
  return axis >= 1 && axis < static_cast<int64_t>(s.size()) ? s[static_cast<size_t>(axis)] : 0;
}

// A side of a node whose positions carry units (before grouping).
struct RawMember {
  std::string node, op;
  ChannelRole role;
  std::vector<int64_t> units;  // per position
  bool tied = false;
};

int64_t lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

}  // namespace

std::vector<std::string> DependencyGroup::producers() const {
  std::vector<std::string> out;
  for (const auto& m : members)
    if (m.role == ChannelRole::kOutput) out.push_back(m.node);
  return out;
}

int64_t DependencyGroup::prunable() const {
  return static_cast<int64_t>(std::count(fixed.begin(), fixed.end(), false));
}

std::string DependencyGroup::to_string() const {
  std::ostringstream os;
  os << "group " << id << ": " << channels << " channels, " << prunable() << " prunable";
  if (segments > 1) os << ", " << segments << " equal segments (grouped convolutions)";
  os << "\n";
  for (const auto& m : members) {
    os << "  " << m.node << " (" << m.op << ") " << channel_role_name(m.role) << " [" << m.size << "]";
    for (const auto& [t, axis] : m.tensors) os << " " << t << "[axis " << axis << "]";
    if (m.tied) os << " (outputs bound to inputs)";
    os << ":";
    const size_t show = std::min<size_t>(m.positions.size(), 8);
    for (size_t k = 0; k < show; ++k) {
      os << (k ? ", " : " ");
      const auto& p = m.positions[k];
      if (p.size() == 1) os << p[0];
      else if (p.empty()) os << "-";
      else if (p.back() - p.front() + 1 == static_cast<int64_t>(p.size())) os << p.front() << ".." << p.back();
      else os << "{" << p.size() << " positions}";
    }
    if (m.positions.size() > show) os << ", ...";
    os << "\n";
  }
  if (!fixed_reason.empty()) os << "  fixed: " << channels - prunable() << " channels (" << fixed_reason << ")\n";
  return os.str();
}

std::vector<DependencyGroup> dependency_groups(const Graph& graph) {
  Units units;
  std::map<std::string, std::vector<int64_t>> value_units;  // per value: the unit of each position
  std::map<std::string, int64_t> value_axis;                 // per value: its channel axis
  std::vector<RawMember> raw;

  auto fresh_units = [&](int64_t n, const std::string& why) {
    std::vector<int64_t> u(static_cast<size_t>(n));
    for (auto& x : u) x = units.fresh(why);
    return u;
  };
  for (const auto& in : graph.inputs()) {
    value_units[in] = fresh_units(channel_count(graph.value(in).shape, 1), "graph input '" + in + "'");
    value_axis[in] = 1;
  }

  for (const Node& n : graph.nodes()) {
    std::vector<Shape> in_shapes, out_shapes;
    for (const auto& v : n.inputs) in_shapes.push_back(graph.value(v).shape);
    for (const auto& v : n.outputs) out_shapes.push_back(graph.value(v).shape);
    auto units_of = [&](const std::string& v) -> std::vector<int64_t>& {
      auto it = value_units.find(v);
      if (it == value_units.end()) throw Error("node '" + n.name + "': value '" + v + "' has no channels recorded");
      return it->second;
    };
    std::vector<std::pair<std::string, int64_t>> tensors;
    const std::string where = "node '" + n.name + "' (" + n.op + ")";
    const bool packed = !n.params.contains("weight") && n.has_attr("weight_shape");

    if (is_weighted_layer(n)) {
      // The channels the layer reads, on its channel axis of its input: the input value's, when
      // the value carries its channels on that axis; otherwise channels of their own, fixed.
      const int64_t in_axis = channel_axis(n, in_shapes.at(0));
      std::vector<int64_t> in = units_of(n.inputs.at(0));
      if (value_axis.at(n.inputs[0]) != in_axis) {
        const std::string why = where + " reads channels on axis " + std::to_string(in_axis) + " of '" + n.inputs[0] +
                                "', whose channels are on axis " + std::to_string(value_axis.at(n.inputs[0]));
        for (int64_t u : in) units.fix(u, why);
        in = fresh_units(channel_count(in_shapes[0], in_axis), why);
      }
      if (packed)
        for (int64_t u : in) units.fix(u, where + " has a packed weight");
      raw.push_back({n.name, n.op, ChannelRole::kInput, in, false});
      const std::vector<int64_t> ties = channel_ties(n);
      const int64_t out_axis = channel_axis(n, out_shapes.at(0));
      const int64_t cout = channel_count(out_shapes[0], out_axis);
      std::vector<int64_t> out;
      if (!ties.empty()) {
        if (static_cast<int64_t>(ties.size()) != cout) throw Error(where + ": channel ties do not match its outputs");
        for (int64_t t : ties) out.push_back(in.at(static_cast<size_t>(t)));
        raw.back().tied = true;
      } else {
        out = fresh_units(cout, packed ? where + " has a packed weight" : "");
      }
      raw.push_back({n.name, n.op, ChannelRole::kOutput, out, !ties.empty()});
      value_units[n.outputs[0]] = out;
      value_axis[n.outputs[0]] = out_axis;
      for (size_t o = 1; o < n.outputs.size(); ++o) {
        value_units[n.outputs[o]] = fresh_units(channel_count(out_shapes[o], 1), where + " output " + std::to_string(o));
        value_axis[n.outputs[o]] = 1;
      }
      continue;
    }

    ChannelAxes axes;
    for (const auto& v : n.inputs) axes.inputs.push_back(value_axis.at(v));
    const std::optional<ChannelMap> map = channel_map(n, in_shapes, out_shapes, &axes);
    axes.outputs.resize(n.outputs.size(), 1);
    for (size_t o = 0; o < n.outputs.size(); ++o) value_axis[n.outputs[o]] = axes.outputs[o];
    if (!map) {
      const std::string why = "through " + where + ", which pruning cannot follow";
      for (const auto& v : n.inputs)
        for (int64_t u : units_of(v)) units.fix(u, why);
      for (size_t o = 0; o < n.outputs.size(); ++o)
        value_units[n.outputs[o]] = fresh_units(channel_count(out_shapes[o], axes.outputs[o]), why);
      continue;
    }
    if (map->size() != n.outputs.size()) throw Error(where + ": its channel map lists " + std::to_string(map->size()) +
                                                     " outputs, the node has " + std::to_string(n.outputs.size()));
    std::vector<std::vector<bool>> used(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) used[i].assign(units_of(n.inputs[i]).size(), false);
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const auto& positions = (*map)[o];
      if (static_cast<int64_t>(positions.size()) != channel_count(out_shapes[o], axes.outputs[o]))
        throw Error(where + ": its channel map has " + std::to_string(positions.size()) + " positions for output " +
                    shape_str(out_shapes[o]));
      std::vector<int64_t> out;
      for (const auto& sources : positions) {
        if (sources.empty()) {
          out.push_back(units.fresh(where + " makes channels from no input channel"));
          continue;
        }
        int64_t u = -1;
        for (const ChannelSource& s : sources) {
          std::vector<int64_t>& src = units_of(n.inputs.at(static_cast<size_t>(s.input)));
          const int64_t unit = src.at(static_cast<size_t>(s.channel));
          used[static_cast<size_t>(s.input)][static_cast<size_t>(s.channel)] = true;
          u = u < 0 ? units.find(unit) : units.unite(u, unit);
        }
        out.push_back(u);
      }
      value_units[n.outputs[o]] = std::move(out);
    }
    // Input channels the map does not pass on would change the input's width alone.
    for (size_t i = 0; i < n.inputs.size(); ++i)
      for (size_t k = 0; k < used[i].size(); ++k)
        if (!used[i][k]) units.fix(units_of(n.inputs[i])[k], "not passed on by " + where);
    // Pass-through ops with channel tensors (BN statistics) are members; so are map ops whose
    // slicer updates attributes (split sizes, reshape target).
    const OpTraits& t = op_traits(n.op);
    if (!channel_tensors(n).empty() && !n.outputs.empty())
      raw.push_back({n.name, n.op, ChannelRole::kChannel, value_units[n.outputs[0]], false});
    else if (t.slice_channels && !n.inputs.empty())
      raw.push_back({n.name, n.op, ChannelRole::kInput, units_of(n.inputs[0]), false});
  }
  for (const auto& out : graph.outputs())
    for (int64_t u : value_units.at(out)) units.fix(u, "graph output '" + out + "'");

  // Group = units that share a member axis (second union-find over the roots).
  const size_t total = units.size();
  std::vector<int64_t> group_parent(total);
  std::iota(group_parent.begin(), group_parent.end(), int64_t{0});
  auto gfind = [&](int64_t x) {
    while (group_parent[static_cast<size_t>(x)] != x) x = group_parent[static_cast<size_t>(x)] = group_parent[static_cast<size_t>(group_parent[static_cast<size_t>(x)])];
    return x;
  };
  for (auto& m : raw) {
    for (auto& u : m.units) u = units.find(u);
    for (size_t k = 1; k < m.units.size(); ++k) {
      const int64_t a = gfind(m.units[0]), b = gfind(m.units[k]);
      if (a != b) group_parent[static_cast<size_t>(std::max(a, b))] = std::min(a, b);
    }
  }

  // Collect groups in order of first member; channels in order of first appearance.
  std::map<int64_t, size_t> group_of;                 // group root → index in `groups`
  std::vector<DependencyGroup> groups;
  std::vector<std::map<int64_t, int64_t>> channel_of;  // per group: unit root → channel index
  for (const auto& m : raw) {
    if (m.units.empty()) continue;
    const int64_t root = gfind(m.units[0]);
    auto [it, inserted] = group_of.emplace(root, groups.size());
    if (inserted) {
      groups.emplace_back();
      groups.back().id = static_cast<int64_t>(groups.size()) - 1;
      channel_of.emplace_back();
    }
    DependencyGroup& g = groups[it->second];
    auto& channels = channel_of[it->second];
    for (int64_t u : m.units)
      if (channels.emplace(u, static_cast<int64_t>(channels.size())).second) {
        g.fixed.push_back(!units.reason(u).empty());
        if (g.fixed.back() && g.fixed_reason.empty()) g.fixed_reason = units.reason(u);
      }
  }
  for (auto& g : groups) g.channels = static_cast<int64_t>(g.fixed.size());
  for (const auto& m : raw) {
    if (m.units.empty()) continue;
    const size_t gi = group_of.at(gfind(m.units[0]));
    DependencyGroup& g = groups[gi];
    Member member;
    member.node = m.node;
    member.op = m.op;
    member.role = m.role;
    member.size = static_cast<int64_t>(m.units.size());
    member.tied = m.tied;
    member.positions.assign(static_cast<size_t>(g.channels), {});
    for (size_t p = 0; p < m.units.size(); ++p)
      member.positions[static_cast<size_t>(channel_of[gi].at(m.units[p]))].push_back(static_cast<int64_t>(p));
    const Node& node = graph.node(m.node);
    for (const ChannelTensor& c : channel_tensors(node)) {
      const bool on_side = c.role == m.role || c.role == ChannelRole::kChannel;
      const at::Tensor* t = c.buffer ? node.buffers.find(c.name) : node.params.find(c.name);
      if (on_side && t && t->defined()) member.tensors.emplace_back(c.name, c.axis);
    }
    g.members.push_back(std::move(member));
  }

  // Grouped convolutions: equal counts per conv group. A grouped member (groups G > 1, not
  // depthwise) sees each channel either inside one of its G groups, which then constrains the
  // channel's segment, or spread evenly over all G (after a channel shuffle, a channel is one
  // position in every group), which removes the same count from each group whatever is chosen.
  for (auto& g : groups) {
    g.segment.assign(static_cast<size_t>(g.channels), 0);
    struct Grouped {
      const Member* member;
      int64_t groups;
    };
    std::vector<Grouped> constraining;
    std::string uneven;
    for (const auto& m : g.members) {
      if (m.tied || (m.role != ChannelRole::kOutput && m.role != ChannelRole::kInput)) continue;
      const int64_t groups_attr = channel_groups(graph.node(m.node));
      if (groups_attr <= 1) continue;
      if (m.size % groups_attr != 0) {
        uneven = m.node + " has " + std::to_string(m.size) + " channels in " + std::to_string(groups_attr) + " groups";
        break;
      }
      const int64_t per = m.size / groups_attr;
      bool inside = true, spread = true;
      // Equal channel counts per segment give equal conv groups only when the member sees every
      // channel of the group, each at as many positions.
      bool uniform = true;
      for (const auto& p : m.positions) uniform = uniform && !p.empty() && p.size() == m.positions.front().size();
      for (const auto& p : m.positions) {
        if (p.empty()) continue;
        std::vector<int64_t> count(static_cast<size_t>(groups_attr), 0);
        for (int64_t q : p) ++count[static_cast<size_t>(q / per)];
        const auto nonzero = std::count_if(count.begin(), count.end(), [](int64_t c) { return c > 0; });
        inside = inside && nonzero == 1;
        spread = spread && std::all_of(count.begin(), count.end(), [&](int64_t c) { return c == count[0]; });
      }
      if (inside && !uniform) {
        uneven = m.node + " sees the group's channels at different numbers of positions (or not all of them)";
        break;
      }
      if (inside) constraining.push_back({&m, groups_attr});
      else if (!spread) {
        uneven = m.node + " sees a channel in some of its " + std::to_string(groups_attr) + " groups only";
        break;
      }
    }
    if (uneven.empty())
      for (const Grouped& c : constraining) g.segments = lcm(g.segments, c.groups);
    // Segment by the constraining members' positions (each sees every channel); they must agree.
    std::vector<int64_t> assigned(static_cast<size_t>(g.channels), -1);
    for (const Grouped& c : constraining) {
      if (!uneven.empty()) break;
      if (c.member->size % g.segments != 0) {
        uneven = c.member->node + " has " + std::to_string(c.member->size) + " channels, not a multiple of " +
                 std::to_string(g.segments) + " segments";
        break;
      }
      const int64_t per = c.member->size / g.segments;
      for (size_t k = 0; k < c.member->positions.size() && uneven.empty(); ++k) {
        const auto& p = c.member->positions[k];
        const int64_t s = p.front() / per;
        if (p.back() / per != s || (assigned[k] >= 0 && assigned[k] != s))
          uneven = "grouped convolutions see these channels in different orders";
        else assigned[k] = s;
      }
    }
    if (!uneven.empty()) {
      std::fill(g.fixed.begin(), g.fixed.end(), true);
      g.fixed_reason = uneven;
      g.segments = 1;
      continue;
    }
    if (g.segments > 1) g.segment = assigned;
  }
  return groups;
}

}  // namespace whittle::prune
