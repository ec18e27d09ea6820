#include "core/options.h"

#include <algorithm>
#include <sstream>

namespace whittle {

namespace {

[[noreturn]] void usage_error(const std::string& msg) { throw Error(msg, ErrorKind::kUsage); }

}  // namespace

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::kString: return "string";
    case KeyType::kInt: return "integer";
    case KeyType::kFloat: return "number";
    case KeyType::kBool: return "boolean";
    case KeyType::kFloatList: return "list of numbers";
    case KeyType::kIntList: return "list of integers";
    case KeyType::kStringList: return "list of strings";
    case KeyType::kMap: return "section";
    case KeyType::kList: return "list";
    case KeyType::kAny: return "any";
  }
  return "?";
}

namespace {

template <typename T>
std::string list_text(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string value_text(const SettingValue::Storage& s) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return number_text(d); }
    std::string operator()(const std::string& t) const { return t; }
    std::string operator()(const std::vector<double>& v) const { return list_text(v); }
    std::string operator()(const std::vector<int64_t>& v) const { return list_text(v); }
    std::string operator()(const std::vector<std::string>& v) const { return list_text(v); }
  };
  return std::visit(Visitor{}, s);
}

const char* value_kind(const SettingValue::Storage& s) {
  switch (s.index()) {
    case 0: return "a boolean";
    case 1: return "an integer";
    case 2: return "a number";
    case 3: return "a string";
    case 4: return "a list of numbers";
    case 5: return "a list of integers";
    default: return "a list of strings";
  }
}

[[noreturn]] void not_a(const SettingValue::Storage& s, const char* wanted) {
  usage_error("expected " + std::string(wanted) + ", got " + value_kind(s) + " (" + value_text(s) + ")");
}

int64_t to_integer(const SettingValue::Storage& s) {
  if (const auto* i = std::get_if<int64_t>(&s)) return *i;
  if (const auto* d = std::get_if<double>(&s))
    if (std::isfinite(*d) && std::floor(*d) == *d && std::fabs(*d) < 9.0e18) return static_cast<int64_t>(*d);
  not_a(s, "an integer");
}

}  // namespace

template <>
bool SettingValue::as<bool>() const {
  if (const auto* b = std::get_if<bool>(&value_)) return *b;
  not_a(value_, "a boolean");
}
template <>
int64_t SettingValue::as<int64_t>() const { return to_integer(value_); }
template <>
int SettingValue::as<int>() const {
  const int64_t v = to_integer(value_);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) not_a(value_, "an int-sized integer");
  return static_cast<int>(v);
}
template <>
double SettingValue::as<double>() const {
  if (const auto* d = std::get_if<double>(&value_)) return *d;
  if (const auto* i = std::get_if<int64_t>(&value_)) return static_cast<double>(*i);
  not_a(value_, "a number");
}
template <>
std::string SettingValue::as<std::string>() const {
  if (const auto* t = std::get_if<std::string>(&value_)) return *t;
  not_a(value_, "a string");
}
template <>
std::vector<double> SettingValue::as<std::vector<double>>() const {
  if (const auto* v = std::get_if<std::vector<double>>(&value_)) return *v;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&value_)) return std::vector<double>(v->begin(), v->end());
  not_a(value_, "a list of numbers");
}
template <>
std::vector<int64_t> SettingValue::as<std::vector<int64_t>>() const {
  if (const auto* v = std::get_if<std::vector<int64_t>>(&value_)) return *v;
  not_a(value_, "a list of integers");
}
template <>
std::vector<std::string> SettingValue::as<std::vector<std::string>>() const {
  if (const auto* v = std::get_if<std::vector<std::string>>(&value_)) return *v;
  if (const auto* t = std::get_if<std::string>(&value_)) return {*t};
  not_a(value_, "a list of strings");
}

std::string SettingValue::text() const { return value_text(value_); }

const SettingValue& Settings::operator[](const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw Error("setting '" + key + "' is not given");
  return it->second;
}

bool Range::contains(double v) const {
  if (!std::isfinite(v)) return false;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  return hi_open ? v < hi : v <= hi;
}

std::string Range::text() const {
  const auto num = number_text;
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (!has_lo && !has_hi) return "";
  if (!has_hi) return (lo_open ? "> " : "≥ ") + num(lo);
  if (!has_lo) return (hi_open ? "< " : "≤ ") + num(hi);
  if (!lo_open && !hi_open) return num(lo) + ".." + num(hi);
  return std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
}

std::string flag_name(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string OptionSource::key(const std::string& k) const {
  return style == KeyStyle::kFlag ? flag_name(k) : "key '" + k + "'";
}

std::string OptionSource::about(const std::string& k) const {
  return where + (style == KeyStyle::kFlag ? ": " : ", ") + key(k);
}

}  // namespace whittle
