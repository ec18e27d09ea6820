#include "tools/report_html.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_number.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "runner/run_files.h"
#include "tools/model_source.h"

namespace whittle::cli {

namespace {

using json = nlohmann::json;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// 1234567 → "1,234,567".
std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

// Three significant digits: 1.11 MB, 64.4 kB, 250 kB, 12.5 B.
std::string human_bytes(double b) {
  auto sig3 = [](double v) { return fixed(v, v >= 100 ? 0 : v >= 10 ? 1 : 2); };
  if (b >= 1e6) return sig3(b / 1e6) + " MB";
  if (b >= 1e3) return sig3(b / 1e3) + " kB";
  return sig3(b) + " B";
}

std::string human_count(double v) {
  if (v >= 1e9) return fixed(v / 1e9, 2) + " G";
  if (v >= 1e6) return fixed(v / 1e6, 2) + " M";
  if (v >= 1e3) return fixed(v / 1e3, 1) + " k";
  return fixed(v, 0);
}

std::string human_seconds(double s) {
  if (s < 0) return "—";
  if (s < 90) return fixed(s, 0) + " s";
  if (s < 5400) return fixed(s / 60, 1) + " min";
  const int64_t m = static_cast<int64_t>(std::llround(s / 60));
  return std::to_string(m / 60) + " h " + std::to_string(m % 60) + " min";
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Tableau 10: distinguishable on white, in print and for the common colour-vision deficiencies.
const char* color_of(size_t i) {
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return palette[i % 10];
}

// ---- reading a run directory ----

const json& require(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) throw Error(file + ": no '" + key + "' (not a whittle run report)");
  return j.at(key);
}

template <typename T>
T value_of(const json& j, const char* key, const std::string& file) {
  try {
    if constexpr (std::is_same_v<T, int64_t>) return json_int64(require(j, key, file), file + ": '" + key + "'");
    else return require(j, key, file).get<T>();
  } catch (const json::exception& e) {
    throw Error(file + ": '" + key + "' has the wrong type (" + e.what() + ")");
  }
}

// A number that may be null (a diverged run's loss as JSON writes it): NaN then.
double number_or_nan(const json& j, const char* key) {
  const json& v = j.at(key);
  return v.is_null() ? std::nan("") : v.get<double>();
}

// An optional key of report.json, `fallback` when absent; a value of the wrong type is an error
// naming the file.
template <typename T>
T optional_value(const json& j, const char* key, const T& fallback, const std::string& file) {
  return j.contains(key) && !j.at(key).is_null() ? value_of<T>(j, key, file) : fallback;
}

runner::ModelSummary summary_from_json(const json& j, const std::string& file) {
  runner::ModelSummary s;
  try {
    for (const json& n : j.at("nodes")) {
      runner::LayerSummary l;
      l.name = n.at("name").get<std::string>();
      l.op = n.at("op").get<std::string>();
      l.output_shape = json_int64s(n.at("output_shape"), file + ": model_summary output_shape");
      l.params = json_int64(n.at("params"), file + ": model_summary params");
      l.macs = json_int64(n.at("macs"), file + ": model_summary macs");
      l.weight_bits = json_int64(n.at("weight_bits"), file + ": model_summary weight_bits");
      if (n.contains("quantizer")) l.quantizer = n.at("quantizer").get<std::string>();
      if (n.contains("unpruned_channels")) {
        l.channels = json_int64(n.at("channels"), file + ": model_summary channels");
        l.unpruned_channels = json_int64(n.at("unpruned_channels"), file + ": model_summary unpruned_channels");
        s.pruned = true;
      }
      if (n.contains("unpruned_params")) {
        l.unpruned_params = json_int64(n.at("unpruned_params"), file + ": model_summary unpruned_params");
        l.unpruned_macs = json_int64(n.at("unpruned_macs"), file + ": model_summary unpruned_macs");
        s.pruned = true;
      }
      s.layers.push_back(std::move(l));
    }
    const json& t = j.at("total");
    s.params = json_int64(t.at("params"), file + ": model_summary params");
    s.macs = json_int64(t.at("macs"), file + ": model_summary macs");
    s.bytes = t.at("bytes").get<double>();
    s.fp32_bytes = t.at("fp32_bytes").get<double>();
    s.theoretical_bytes = t.at("theoretical_bytes").get<double>();
    if (t.contains("unpruned_params")) {
      s.unpruned_params = json_int64(t.at("unpruned_params"), file + ": model_summary unpruned_params");
      s.unpruned_macs = json_int64(t.at("unpruned_macs"), file + ": model_summary unpruned_macs");
      s.pruned = true;
    }
  } catch (const json::exception& e) {
    throw Error(file + ": damaged 'model_summary' (" + e.what() + ")");
  }
  return s;
}

// "FP32", or the recipe's modifiers in order, each as its modifier labels it: "DoReFa W2A2", "TWN",
// "pruned L1 (50 % MACs)", "KD", ... A method named by several modifiers (one quantize modifier
// per group of layers, each with its own clip level, say) is named once, where it first appears.
// The recipe is read by the recipe parser (runner::parse_recipe_modifiers): a recipe it refuses
// is an error naming the file.
std::string method_of_recipe(const std::string& path) {
  std::vector<std::string> parts;
  for (const runner::ModifierSpec& m : runner::parse_recipe_modifiers(read_file(path), path))
    parts.push_back(runner::modifier_label(m));
  if (parts.empty()) return "FP32";
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i)
    if (std::find(parts.begin(), parts.begin() + i, parts[i]) == parts.begin() + i)
      out += (out.empty() ? "" : " + ") + parts[i];
  return out;
}

// ---- SVG ----

// The round step of about `count` ticks over [lo, hi] (1, 2, 2.5 or 5 times a power of ten).
double nice_step(double lo, double hi, int count) {
  if (!(hi > lo)) return 1;
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 2.5, 5.0})
    if (f * mag >= raw) return f * mag;
  return 10 * mag;
}

// Tick values from the multiple of `step` at or below lo to the one at or above hi.
std::vector<double> enclosing_ticks(double lo, double hi, double step) {
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9) * step, last = std::ceil(hi / step - 1e-9) * step;
  for (double v = first; v <= last + step * 1e-6 && ticks.size() < 200; v += step) ticks.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  if (ticks.size() < 2) ticks.push_back(first + step);
  return ticks;
}

// Decimals that show every multiple of `step` exactly (2.5 → 1, 0.25 → 2, 5 → 0).
int decimals_of(double step) {
  for (int d = 0; d < 6; ++d) {
    const double scaled = step * std::pow(10.0, d);
    if (std::abs(scaled - std::round(scaled)) < 1e-6 * std::max(1.0, scaled)) return d;
  }
  return 6;
}

std::string tick_text(double v, double step, bool percent) { return fixed(v, decimals_of(step)) + (percent ? " %" : ""); }

struct Series {
  std::string label;
  std::string color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
};

// A line chart, `width`×`height` px plus a legend at the right.
std::string line_chart(const std::string& title, const std::vector<Series>& series, const std::string& x_label,
                       const std::string& y_label, bool percent, int width, int height, const std::string& css_class) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  const double ystep = nice_step(y0, y1, 5);
  const std::vector<double> yt = enclosing_ticks(y0, y1, ystep);
  y0 = yt.front(), y1 = yt.back();
  const double xstep = x1 - x0 <= 12 ? 1 : nice_step(x0, x1, 8);  // epochs: every integer up to 12
  std::vector<double> xt;
  for (double v : enclosing_ticks(x0, x1, xstep))
    if (v >= x0 - 1e-9 && v <= x1 + 1e-9) xt.push_back(v);
  size_t longest = 0;
  for (const auto& s : series) longest = std::max(longest, s.label.size());
  const double ml = 72, mr = 12, mt = 26, mb = 42, legend = 44 + 6.6 * static_cast<double>(longest);
  const double pw = width - ml - mr, ph = height - mt - mb;
  auto px = [&](double x) { return ml + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return mt + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::ostringstream o;
  const double total_w = width + legend;
  const double total_h = std::max<double>(height, mt + 18.0 * static_cast<double>(series.size()) + 10);
  o << "<svg class=\"" << css_class << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << total_w << "\" height=\""
    << total_h << "\" viewBox=\"0 0 " << total_w << " " << total_h << "\" role=\"img\" aria-label=\"" << escape(title)
    << "\">\n<title>" << escape(title) << "</title>\n";
  o << "<text x=\"" << ml << "\" y=\"16\" class=\"ct\">" << escape(title) << "</text>\n";
  for (double v : yt) {
    o << "<line x1=\"" << ml << "\" x2=\"" << ml + pw << "\" y1=\"" << fixed(py(v), 1) << "\" y2=\"" << fixed(py(v), 1)
      << "\" class=\"grid\"/><text x=\"" << ml - 6 << "\" y=\"" << fixed(py(v) + 4, 1) << "\" class=\"yt\">"
      << tick_text(v, ystep, percent) << "</text>\n";
  }
  for (double v : xt)
    o << "<text x=\"" << fixed(px(v), 1) << "\" y=\"" << mt + ph + 16 << "\" class=\"xt\">" << tick_text(v, xstep, false)
      << "</text>\n";
  o << "<rect x=\"" << ml << "\" y=\"" << mt << "\" width=\"" << pw << "\" height=\"" << ph << "\" class=\"frame\"/>\n";
  o << "<text x=\"" << ml + pw / 2 << "\" y=\"" << height - 6 << "\" class=\"xl\">" << escape(x_label) << "</text>\n";
  o << "<text transform=\"translate(14 " << mt + ph / 2 << ") rotate(-90)\" class=\"xl\">" << escape(y_label)
    << "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    if (s.points.empty()) continue;
    o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << " points=\"";
    for (const auto& [x, y] : s.points) o << fixed(px(x), 1) << "," << fixed(py(y), 1) << " ";
    o << "\"><title>" << escape(s.label) << "</title></polyline>\n";
    if (s.points.size() == 1)
      o << "<circle cx=\"" << fixed(px(s.points[0].first), 1) << "\" cy=\"" << fixed(py(s.points[0].second), 1)
        << "\" r=\"3\" fill=\"" << s.color << "\"/>\n";
    const double ly = mt + 18.0 * static_cast<double>(i) + 6;
    o << "<line x1=\"" << width + 4 << "\" x2=\"" << width + 28 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\""
      << s.color << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << "/><text x=\""
      << width + 34 << "\" y=\"" << ly + 4 << "\" class=\"lg\">" << escape(s.label) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

// Test top-1 against checkpoint bytes (log scale), the Pareto front joined and its points filled.
std::string pareto_chart(const std::vector<RunSummary>& runs) {
  const std::vector<size_t> front = pareto_front(runs);
  const std::set<size_t> on_front(front.begin(), front.end());
  double b0 = 1e300, b1 = 0, a0 = 1e300, a1 = -1e300;
  for (const auto& r : runs) {
    const double b = static_cast<double>(std::max<int64_t>(r.checkpoint_bytes, 1));
    b0 = std::min(b0, b), b1 = std::max(b1, b), a0 = std::min(a0, 100 * r.test_top1), a1 = std::max(a1, 100 * r.test_top1);
  }
  double lx0 = std::floor(std::log10(b0) * 4) / 4 - 0.05, lx1 = std::ceil(std::log10(b1) * 4) / 4 + 0.05;
  if (a1 - a0 < 1) a0 -= 0.5, a1 += 0.5;
  const double ystep = nice_step(a0, a1, 5);
  const std::vector<double> yt = enclosing_ticks(a0, a1, ystep);
  const double y0 = yt.front(), y1 = yt.back();
  const int width = 720, height = 380;
  const double ml = 72, mr = 150, mt = 26, mb = 44, pw = width - ml - mr, ph = height - mt - mb;
  auto px = [&](double bytes) { return ml + (std::log10(bytes) - lx0) / (lx1 - lx0) * pw; };
  auto py = [&](double top1) { return mt + (1 - (top1 - y0) / (y1 - y0)) * ph; };
  std::ostringstream o;
  o << "<svg class=\"pareto\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height
    << "\" role=\"img\" aria-label=\"test top-1 against checkpoint size\">\n<title>test top-1 against checkpoint size</title>\n";
  o << "<text x=\"" << ml << "\" y=\"16\" class=\"ct\">Test top-1 against checkpoint size (Pareto front joined)</text>\n";
  for (double v : yt)
      o << "<line x1=\"" << ml << "\" x2=\"" << ml + pw << "\" y1=\"" << fixed(py(v), 1) << "\" y2=\"" << fixed(py(v), 1)
        << "\" class=\"grid\"/><text x=\"" << ml - 6 << "\" y=\"" << fixed(py(v) + 4, 1) << "\" class=\"yt\">"
        << tick_text(v, ystep, true) << "</text>\n";
  // Log-scale ticks at 1, 2 and 5 times the powers of ten inside the range; where fewer than three
  // fall inside (runs of similar size), round linear steps.
  std::vector<double> xt;
  for (int e = static_cast<int>(std::floor(lx0)); e <= static_cast<int>(std::ceil(lx1)); ++e)
    for (double f : {1.0, 2.0, 5.0}) {
      const double b = f * std::pow(10.0, e);
      if (std::log10(b) >= lx0 && std::log10(b) <= lx1) xt.push_back(b);
    }
  if (xt.size() < 3) {
    xt.clear();
    const double lo = std::pow(10.0, lx0), hi = std::pow(10.0, lx1);
    for (double b : enclosing_ticks(lo, hi, nice_step(lo, hi, 4)))
      if (b >= lo && b <= hi) xt.push_back(b);
  }
  for (double b : xt)
    o << "<line x1=\"" << fixed(px(b), 1) << "\" x2=\"" << fixed(px(b), 1) << "\" y1=\"" << mt << "\" y2=\"" << mt + ph
      << "\" class=\"grid\"/><text x=\"" << fixed(px(b), 1) << "\" y=\"" << mt + ph + 16 << "\" class=\"xt\">"
      << human_bytes(b) << "</text>\n";
  o << "<rect x=\"" << ml << "\" y=\"" << mt << "\" width=\"" << pw << "\" height=\"" << ph << "\" class=\"frame\"/>\n";
  o << "<text x=\"" << ml + pw / 2 << "\" y=\"" << height - 6 << "\" class=\"xl\">checkpoint file (bytes, log scale)</text>\n";
  o << "<text transform=\"translate(14 " << mt + ph / 2 << ") rotate(-90)\" class=\"xl\">test top-1</text>\n";
  if (front.size() > 1) {
    o << "<polyline class=\"front\" fill=\"none\" points=\"";
    for (size_t i : front)
      o << fixed(px(static_cast<double>(std::max<int64_t>(runs[i].checkpoint_bytes, 1))), 1) << ","
        << fixed(py(100 * runs[i].test_top1), 1) << " ";
    o << "\"/>\n";
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    const double x = px(static_cast<double>(std::max<int64_t>(r.checkpoint_bytes, 1))), y = py(100 * r.test_top1);
    const bool f = on_front.count(i) > 0;
    o << "<circle cx=\"" << fixed(x, 1) << "\" cy=\"" << fixed(y, 1) << "\" r=\"6\" class=\"" << (f ? "pt front" : "pt")
      << "\" data-run=\"" << escape(r.label) << "\" stroke=\"" << color_of(i) << "\" fill=\"" << (f ? color_of(i) : "white")
      << "\"><title>" << escape(r.label) << ": " << escape(r.method) << ", " << fixed(100 * r.test_top1, 2) << " %, "
      << grouped(r.checkpoint_bytes) << " B" << (f ? " (Pareto front)" : "") << "</title></circle>\n";
    o << "<text x=\"" << fixed(x + 9, 1) << "\" y=\"" << fixed(y + 4, 1) << "\" class=\"pl\">" << escape(r.label)
      << "</text>\n";
  }
  o << "<circle cx=\"" << width - mr + 18 << "\" cy=\"" << mt + 8 << "\" r=\"5\" class=\"pt front\" fill=\"#555\" stroke=\"#555\"/>"
    << "<text x=\"" << width - mr + 28 << "\" y=\"" << mt + 12 << "\" class=\"lg\">on the front</text>\n"
    << "<circle cx=\"" << width - mr + 18 << "\" cy=\"" << mt + 26 << "\" r=\"5\" class=\"pt\" fill=\"white\" stroke=\"#555\"/>"
    << "<text x=\"" << width - mr + 28 << "\" y=\"" << mt + 30 << "\" class=\"lg\">dominated</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string layer_table(const runner::ModelSummary& s) {
  std::ostringstream o;
  o << "<table class=\"layers\"><thead><tr><th>node</th><th>op</th><th>output shape</th><th>bits</th>"
    << "<th>channels kept</th><th>parameters</th><th>MACs</th><th>quantizer (learned values)</th></tr></thead><tbody>\n";
  for (const auto& l : s.layers) {
    if (l.params == 0 && l.macs == 0 && l.unpruned_channels < 0) continue;  // reshapes, activations, adds
    o << "<tr><td>" << escape(l.name) << "</td><td>" << escape(l.op) << "</td><td>" << escape(shape_str(l.output_shape))
      << "</td><td class=\"n\">" << (l.weight_bits ? std::to_string(l.weight_bits) : "—") << "</td><td class=\"n\">";
    if (l.unpruned_channels >= 0) o << l.channels << " of " << l.unpruned_channels;
    else o << (l.output_shape.size() >= 2 ? std::to_string(l.output_shape[1]) : "—");
    o << "</td><td class=\"n\">" << grouped(l.params) << "</td><td class=\"n\">" << grouped(l.macs) << "</td><td>"
      << escape(l.quantizer) << "</td></tr>\n";
  }
  o << "</tbody><tfoot><tr><td colspan=\"5\">total (stored " << human_bytes(s.bytes) << ", as float32 "
    << human_bytes(s.fp32_bytes) << ")</td><td class=\"n\">" << grouped(s.params) << "</td><td class=\"n\">" << grouped(s.macs)
    << "</td><td></td></tr></tfoot></table>\n";
  return o.str();
}

/// Throws whittle::Error naming `where` unless `v` is finite and within [lo, hi].
void check_range(double v, double lo, double hi, const std::string& where, const char* what) {
  if (!std::isfinite(v) || v < lo || v > hi) {
    std::ostringstream o;
    o << where << ": " << what << " is " << v << ", not within [" << lo << ", " << hi << "]";
    throw Error(o.str());
  }
}

}  // namespace

RunSummary read_run(const std::string& dir) {
  RunSummary r;
  r.dir = dir;
  const std::string report_path = join_path(dir, runner::run_files::kReport);
  if (!path_exists(dir)) throw Error(dir + " does not exist (give run directories of `whittle run`)", ErrorKind::kUsage);
  if (!is_directory(dir))
    throw Error(dir + " is not a directory (give run directories of `whittle run`)", ErrorKind::kUsage);
  if (!is_regular_file(report_path))
    throw Error(dir + " has no report.json (not a finished run: `whittle run` writes it at the end)");
  json rep;
  try {
    rep = json::parse(read_file(report_path));
  } catch (const json::exception& e) {
    throw Error(report_path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!rep.is_object()) throw Error(report_path + ": not a whittle run report (not a JSON object)");
  r.model = value_of<std::string>(rep, "model", report_path);
  r.test_top1 = value_of<double>(rep, "test_top1", report_path);
  r.test_top5 = value_of<double>(rep, "test_top5", report_path);
  r.test_loss = rep.contains("test_loss") && rep.at("test_loss").is_null() ? std::nan("")
                                                                          : value_of<double>(rep, "test_loss", report_path);
  r.test_images = optional_value(rep, "test_images", int64_t{0}, report_path);
  r.epochs = value_of<int64_t>(rep, "epochs", report_path);
  r.params = value_of<int64_t>(rep, "params", report_path);
  r.macs = value_of<int64_t>(rep, "macs_per_image", report_path);
  r.checkpoint_bytes = value_of<int64_t>(rep, "checkpoint_bytes", report_path);
  r.device = optional_value(rep, "device", std::string(), report_path);
  r.cpu_capability = optional_value(rep, "cpu_capability", std::string(), report_path);
  r.torch_version = optional_value(rep, "torch_version", std::string(), report_path);
  r.intra_op_threads = optional_value(rep, "intra_op_threads", int64_t{0}, report_path);
  // Figures no run can have would draw a broken chart: the report is damaged.
  check_range(r.test_top1, 0, 1, report_path, "test_top1 (a fraction)");
  check_range(r.test_top5, 0, 1, report_path, "test_top5 (a fraction)");
  if (!std::isnan(r.test_loss)) check_range(r.test_loss, 0, HUGE_VAL, report_path, "test_loss");
  check_range(static_cast<double>(r.epochs), 0, 1e7, report_path, "epochs");
  check_range(static_cast<double>(r.checkpoint_bytes), 1, 1e15, report_path, "checkpoint_bytes");
  check_range(static_cast<double>(r.params), 0, 1e15, report_path, "params");
  check_range(static_cast<double>(r.macs), 0, 1e18, report_path, "macs_per_image");

  const std::string metrics_path = join_path(dir, runner::run_files::kMetrics);
  if (path_exists(metrics_path) && !is_regular_file(metrics_path))
    throw Error(metrics_path + " is " + describe_path(metrics_path) + ", not a file of metrics lines");
  if (is_regular_file(metrics_path)) {
    std::istringstream in(read_file(metrics_path));
    std::string line;
    int64_t line_no = 0, images = -1;
    double calibration_seconds = -1;  // the one line of a run of 0 epochs (calibration only)
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = metrics_path + ":" + std::to_string(line_no);
      try {
        const json j = json::parse(line);
        EpochPoint p;
        p.epoch = json_int64(j.at("epoch"), where + ": epoch");
        if (p.epoch == 0) {  // calibration only: test figures, no training, no curve point
          calibration_seconds = j.at("calibration_seconds").get<double>();
          check_range(calibration_seconds, 0, HUGE_VAL, where, "calibration_seconds");
          r.calibration_only = true;
          continue;
        }
        p.train_loss = number_or_nan(j, "train_loss");
        p.train_top1 = j.at("train_top1").get<double>();
        p.test_loss = number_or_nan(j, "test_loss");
        p.test_top1 = j.at("test_top1").get<double>();
        p.test_top5 = j.value("test_top5", 0.0);
        if (j.contains("train_seconds") && j.contains("eval_seconds"))
          p.seconds = j.at("train_seconds").get<double>() + j.at("eval_seconds").get<double>();
        if (j.contains("train_images")) images = json_int64(j.at("train_images"), where + ": train_images");
        p.images_per_second = j.value("train_images_per_second", 0.0);
        check_range(static_cast<double>(p.epoch), 1, 1e7, where, "epoch");
        check_range(p.train_top1, 0, 1, where, "train_top1 (a fraction)");
        check_range(p.test_top1, 0, 1, where, "test_top1 (a fraction)");
        check_range(p.test_top5, 0, 1, where, "test_top5 (a fraction)");
        check_range(p.images_per_second, 0, HUGE_VAL, where, "train_images_per_second");
        if (j.contains("train_seconds") && j.contains("eval_seconds")) check_range(p.seconds, 0, HUGE_VAL, where, "train_seconds + eval_seconds");
        r.curve.push_back(p);
      } catch (const json::exception& e) {
        throw Error(where + ": not a metrics line (" + std::string(e.what()) + ")");
      }
    }
    // An epoch repeated after a kill between its metrics line and its saved state: its last line.
    std::map<int64_t, size_t> last;
    for (size_t i = 0; i < r.curve.size(); ++i) last[r.curve[i].epoch] = i;
    if (last.size() != r.curve.size() || !std::is_sorted(r.curve.begin(), r.curve.end(),
                                                         [](const EpochPoint& a, const EpochPoint& b) { return a.epoch < b.epoch; })) {
      std::vector<EpochPoint> curve;
      for (const auto& [epoch, i] : last) curve.push_back(r.curve[i]);
      r.curve = std::move(curve);
    }
    // Lines without seconds: images per epoch (from the lines that have it) over that line's rate.
    bool all = !r.curve.empty();
    for (size_t i = 0; i < r.curve.size(); ++i) {
      EpochPoint& p = r.curve[i];
      if (p.seconds < 0 && images > 0 && p.images_per_second > 0) p.seconds = static_cast<double>(images) / p.images_per_second;
      if (p.seconds < 0) all = false;
    }
    if (all)
      for (const auto& p : r.curve) r.training_seconds += p.seconds;
    if (r.curve.empty() && calibration_seconds >= 0) r.training_seconds = calibration_seconds;
  }
  if (r.training_seconds <= 0) {
    r.training_seconds = optional_value(rep, "wall_seconds", -1.0, report_path);
    r.training_seconds_from_wall = true;
  }

  if (rep.contains("model_summary")) {
    r.layers = summary_from_json(rep.at("model_summary"), report_path);
  } else {
    // Runs of earlier whittles: the checkpoint beside the report, when it is there.
    std::string ckpt = optional_value(rep, "checkpoint", std::string(), report_path);
    const size_t slash = ckpt.find_last_of('/');
    ckpt = join_path(dir, slash == std::string::npos ? ckpt : ckpt.substr(slash + 1));
    // Only a whittle checkpoint (another tool's file, e.g. micronet's model.pth, has no graph);
    // one that does not load leaves the run without a layer table rather than failing the report.
    const bool h5 = ckpt.size() > 3 && (ckpt.compare(ckpt.size() - 3, 3, ".h5") == 0);
    if (h5 && is_regular_file(ckpt)) {
      try {
        r.layers = runner::summarize_model(runner::load_model(model_source(ckpt, std::nullopt, 10)));
      } catch (const Error& e) {
        std::cerr << "whittle report: " << dir << ": no layer table: " << e.what() << "\n";
      }
    }
  }
  const std::string recipe_path = join_path(dir, runner::run_files::kRecipe);
  r.method = is_regular_file(recipe_path) ? method_of_recipe(recipe_path) : "?";
  r.tool = optional_value(rep, "tool", std::string("whittle"), report_path);
  if (r.layers && r.layers->pruned && r.method.find("pruned") == std::string::npos)
    r.method = "pruned + " + r.method;  // pruned by the run it started from
  if (r.tool != "whittle") r.method += " (" + r.tool + ")";

  return r;
}

void assign_labels(std::vector<RunSummary>& runs) {
  std::vector<std::vector<std::string>> parts;
  for (const auto& r : runs) {
    std::vector<std::string> p;
    std::string part;
    std::istringstream in(r.dir);
    while (std::getline(in, part, '/'))
      if (!part.empty() && part != ".") p.push_back(part);
    if (p.empty()) p.push_back(r.dir);
    parts.push_back(std::move(p));
  }
  for (size_t k = 1;; ++k) {
    std::map<std::string, int> count;
    std::vector<std::string> labels;
    bool more = false;
    for (const auto& p : parts) {
      std::string l;
      for (size_t i = p.size() - std::min(k, p.size()); i < p.size(); ++i) l += (l.empty() ? "" : "/") + p[i];
      more |= p.size() > k;
      ++count[l];
      labels.push_back(l);
    }
    bool unique = true;
    for (const auto& [l, c] : count) unique &= c == 1;
    if (unique || !more) {
      for (size_t i = 0; i < runs.size(); ++i) runs[i].label = labels[i];
      return;
    }
  }
}

std::vector<size_t> pareto_front(const std::vector<RunSummary>& runs) {
  std::vector<size_t> front;
  for (size_t i = 0; i < runs.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < runs.size() && !dominated; ++j) {
      if (i == j) continue;
      const bool no_worse = runs[j].checkpoint_bytes <= runs[i].checkpoint_bytes && runs[j].test_top1 >= runs[i].test_top1;
      const bool better = runs[j].checkpoint_bytes < runs[i].checkpoint_bytes || runs[j].test_top1 > runs[i].test_top1;
      dominated = no_worse && better;
    }
    if (!dominated) front.push_back(i);
  }
  std::sort(front.begin(), front.end(), [&](size_t a, size_t b) {
    return runs[a].checkpoint_bytes != runs[b].checkpoint_bytes ? runs[a].checkpoint_bytes < runs[b].checkpoint_bytes
                                                                  : runs[a].test_top1 < runs[b].test_top1;
  });
  return front;
}

std::string render_report_html(const std::vector<RunSummary>& in, const std::string& title) {
  const std::vector<RunSummary>& runs = in;
  int64_t largest = 0;
  for (const auto& r : runs) largest = std::max(largest, r.checkpoint_bytes);
  const std::vector<size_t> front = pareto_front(runs);
  const std::set<size_t> on_front(front.begin(), front.end());

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << escape(title)
    << "</title>\n<style>\n"
       "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:24px auto;max-width:1100px;padding:0 16px}\n"
       "h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}h3{font-size:15px;margin:18px 0 6px}\n"
       "table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 9px;border-bottom:1px solid #ddd;text-align:left}\n"
       "th{background:#f4f4f4}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}tfoot td{font-weight:600}\n"
       "tr.front td:first-child{font-weight:700}.note{color:#555;font-size:13px}\n"
       "svg{display:block;margin:6px 0;font-size:11px}svg .ct{font-size:13px;font-weight:600;fill:#222}\n"
       "svg .grid{stroke:#e6e6e6}svg .frame{fill:none;stroke:#999}svg .yt{text-anchor:end;fill:#555}\n"
       "svg .xt{text-anchor:middle;fill:#555}svg .xl{text-anchor:middle;fill:#333;font-size:12px}\n"
       "svg .lg{fill:#333}svg .pl{fill:#333;font-size:11px}svg .front{stroke:#333;stroke-width:1.5;stroke-dasharray:4 3}\n"
       "svg circle.pt{stroke-width:2}.curves{display:flex;flex-wrap:wrap;gap:8px}details{margin:6px 0}\n"
       "</style>\n</head>\n<body>\n";
  o << "<h1>" << escape(title) << "</h1>\n<p class=\"note\">" << runs.size() << " run" << (runs.size() == 1 ? "" : "s")
    << " written by <code>whittle report</code>";
  std::set<std::string> machines;
  for (const auto& r : runs)
    if (!r.device.empty())
      machines.insert(r.device + (r.cpu_capability.empty() ? "" : ", " + r.cpu_capability) +
                      (r.intra_op_threads ? ", " + std::to_string(r.intra_op_threads) + (r.intra_op_threads == 1 ? " thread" : " threads") : "") +
                      (r.torch_version.empty() ? "" : ", LibTorch " + r.torch_version));
  if (!machines.empty()) {
    o << "; trained on ";
    bool first = true;
    for (const auto& m : machines) o << (first ? "" : "; ") << escape(m), first = false;
  }
  o << ".</p>\n";

  o << "<h2>Summary</h2>\n<table class=\"summary\"><thead><tr><th>run</th><th>model</th><th>method</th><th class=\"n\">epochs</th>"
       "<th class=\"n\">test top-1</th><th class=\"n\">top-5</th><th class=\"n\">checkpoint</th><th class=\"n\">vs largest</th>"
       "<th class=\"n\">parameters</th><th class=\"n\">MACs/image</th><th class=\"n\">training time</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    o << "<tr" << (on_front.count(i) ? " class=\"front\"" : "") << "><td>" << escape(r.label) << "</td><td>" << escape(r.model)
      << "</td><td>" << escape(r.method) << "</td><td class=\"n\">" << r.epochs << "</td><td class=\"n\">"
      << fixed(100 * r.test_top1, 2) << " %</td><td class=\"n\">" << fixed(100 * r.test_top5, 2) << " %</td><td class=\"n\">"
      << grouped(r.checkpoint_bytes) << " B</td><td class=\"n\">"
      << (r.checkpoint_bytes > 0 ? fixed(static_cast<double>(largest) / static_cast<double>(r.checkpoint_bytes), 1) + "×" : "—")
      << "</td><td class=\"n\">" << grouped(r.params) << "</td><td class=\"n\">" << human_count(static_cast<double>(r.macs))
      << "</td><td class=\"n\">" << human_seconds(r.training_seconds) << (r.training_seconds_from_wall ? "*" : "")
      << "</td></tr>\n";
  }
  o << "</tbody></table>\n<p class=\"note\">Bold: on the Pareto front of checkpoint size and test top-1 (no other run is "
       "at most as large and at least as accurate, and better in one). Training time: every epoch's training pass and evaluation over all sittings";
  bool any_wall = false;
  for (const auto& r : runs) any_wall |= r.training_seconds_from_wall;
  if (any_wall) o << "; * the last sitting's wall time (its metrics lines have no timings)";
  o << ".</p>\n";

  o << "<h2>Accuracy and size</h2>\n" << pareto_chart(runs);

  o << "<h2>Training curves</h2>\n";
  std::vector<Series> all;
  for (size_t i = 0; i < runs.size(); ++i) {
    Series s{runs[i].label, color_of(i), false, {}};
    for (const auto& p : runs[i].curve) s.points.emplace_back(static_cast<double>(p.epoch), 100 * p.test_top1);
    all.push_back(std::move(s));
  }
  o << line_chart("Test top-1 per epoch, every run", all, "epoch", "test top-1", true, 720, 320, "curves-all");

  o << "<h2>Runs</h2>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    o << "<h3 id=\"run-" << i << "\">" << escape(r.label) << ": " << escape(r.method) << "</h3>\n<p class=\"note\">"
      << escape(r.dir) << " · " << escape(r.model) << " · " << r.epochs << " epochs · test top-1 "
      << fixed(100 * r.test_top1, 2) << " % on " << grouped(r.test_images) << " images · checkpoint "
      << grouped(r.checkpoint_bytes) << " B</p>\n";
    if (!r.curve.empty()) {
      Series tl{"train loss", "#4e79a7", true, {}}, vl{"test loss", "#4e79a7", false, {}};
      Series ta{"train top-1", "#e15759", true, {}}, va{"test top-1", "#e15759", false, {}};
      for (const auto& p : r.curve) {
        const double e = static_cast<double>(p.epoch);
        tl.points.emplace_back(e, p.train_loss), vl.points.emplace_back(e, p.test_loss);
        ta.points.emplace_back(e, 100 * p.train_top1), va.points.emplace_back(e, 100 * p.test_top1);
      }
      o << "<div class=\"curves\">\n"
        << line_chart(r.label + ": loss", {tl, vl}, "epoch", "cross-entropy", false, 360, 240, "curves-run")
        << line_chart(r.label + ": top-1", {ta, va}, "epoch", "top-1", true, 360, 240, "curves-run") << "</div>\n";
    } else {
      o << "<p class=\"note\">"
        << (r.calibration_only ? "Calibration only (0 epochs): no training curves." : "No epochs recorded in metrics.jsonl: no curves.")
        << "</p>\n";
    }
    if (r.layers) {
      o << "<details><summary>Layer table (" << r.layers->layers.size() << " nodes; layers with parameters or MACs shown)</summary>\n"
        << layer_table(*r.layers) << "</details>\n";
    } else {
      o << "<p class=\"note\">No model summary in report.json and no checkpoint beside it: no layer table.</p>\n";
    }
  }
  o << "</body>\n</html>\n";
  return o.str();
}

}  // namespace whittle::cli
