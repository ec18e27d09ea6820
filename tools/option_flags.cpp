#include "tools/option_flags.h"

#include <boost/program_options.hpp>

#include <cctype>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

// A boolean that is on unless the flag is given.
bool negated(const KeySpec& k) { return k.type == KeyType::kBool && k.default_text.rfind("true", 0) == 0; }

// The option name boost knows the flag by (no leading dashes).
std::string option_name(const KeySpec& k) {
  const std::string f = flag_name(k.name).substr(2);
  return negated(k) ? "no-" + f : f;
}


// `text` as a finite number; throws a usage error naming the flag.
double number(const std::string& text, const std::string& command, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || !std::isfinite(v))
    throw Error(command + ": " + flag + " '" + text + "' is not a finite number", ErrorKind::kUsage);
  return v;
}

}  // namespace

void OptionFlags::add(po::options_description& opts, const std::vector<KeySpec>& keys, const std::string& owner) {
  for (const KeySpec& k : keys) {
    if (keys_.count(k.name)) continue;
    keys_.emplace(k.name, k);
    order_.push_back(k.name);
    std::string help = (owner.empty() ? "" : owner + ": ") + k.description;
    std::string notes = negated(k) ? "on by default; this flag turns it off" : "";
    if (k.type != KeyType::kBool && !k.default_text.empty() && k.default_text != "[]") {
      notes = "default " + k.default_text;
    }
    if (!k.choices.empty()) {
      std::string all;
      for (const auto& c : k.choices) all += (all.empty() ? "" : ", ") + c;
      notes += (notes.empty() ? "" : "; ") + all;
    }
    if (!k.range.text().empty()) notes += (notes.empty() ? "" : ", ") + k.range.text();
    if (k.type == KeyType::kStringList || k.type == KeyType::kIntList || k.type == KeyType::kFloatList)
      notes += std::string(notes.empty() ? "" : "; ") + "comma-separated";
    if (!notes.empty()) help += " (" + notes + ")";
    const std::string name = option_name(k);
    if (k.type == KeyType::kBool) opts.add_options()(name.c_str(), help.c_str());
    else opts.add_options()(name.c_str(), po::value<std::string>(), help.c_str());
  }
}

std::string OptionFlags::flag(const std::string& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? flag_name(key) : "--" + option_name(it->second);
}

Settings OptionFlags::settings(const po::variables_map& vm, const std::string& command) const {
  Settings out;
  for (const std::string& key : order_) {
    const KeySpec& k = keys_.at(key);
    const std::string name = option_name(k);
    if (!vm.count(name)) continue;
    const std::string flag = "--" + name;
    if (k.type == KeyType::kBool) {
      out[key] = !negated(k);
      continue;
    }
    const std::string text = vm[name].as<std::string>();
    try {
      switch (k.type) {
        case KeyType::kInt:
          // An integer key takes integral values in the 64-bit range only (SettingValue checks).
          out[key] = SettingValue(SettingValue(number(text, command, flag)).as<int64_t>());
          break;
        case KeyType::kFloat: out[key] = number(text, command, flag); break;
        case KeyType::kStringList: out[key] = split_commas(text); break;
        case KeyType::kIntList: {
          std::vector<int64_t> v;
          for (const auto& item : split_commas(text)) v.push_back(SettingValue(number(item, command, flag)).as<int64_t>());
          out[key] = v;
          break;
        }
        case KeyType::kFloatList: {
          std::vector<double> v;
          for (const auto& item : split_commas(text)) v.push_back(number(item, command, flag));
          out[key] = v;
          break;
        }
        default: out[key] = text; break;
      }
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(command + ": ", 0) == 0) throw;
      throw Error(command + ": " + flag + ": " + e.what(), ErrorKind::kUsage);
    }
  }
  return out;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace whittle::cli
