#pragma once
// Options written once: the typed values of recipe keys and command-line flags (SettingValue), the
// description of a key (KeySpec: type, printed default, range, choices), and OptionsSchema, which
// binds each field of a plain options struct to a key, so that the struct's initializers are the
// documented defaults. The recipe's top-level sections, every modifier, quantizer method, pass and
// exporter, `whittle keys` and docs/recipes.md all describe their options through it.
//
//   struct PruneOptions {
//     double sparsity = 0.5;     ///< fraction of channels removed
//     std::string criterion = "l1";
//   };
//   const OptionsSchema<PruneOptions>& schema() {
//     static const auto s = OptionsSchema<PruneOptions>()
//         .add("sparsity", &PruneOptions::sparsity, "fraction of channels removed")
//         .add("criterion", &PruneOptions::criterion, "importance", {"l1", "l2"});
//     return s;
//   }
//   schema().keys();   // KeySpecs: sparsity number 0.5, criterion string l1
//   PruneOptions o = schema().parse(settings, "recipe.yaml:12: modifier 'prune'");

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/error.h"

namespace whittle {

/// A number as recipes and messages print it (the shortest form std::ostream gives: "0.5", "1e-05").
std::string number_text(double v);

/// One value of a modifier setting, typed as the modifier's KeySpec says: a boolean, an integer,
/// a number, a string, or a list of numbers, integers or strings (a section or free-form value is
/// kept as its YAML text, a string).
class SettingValue {
 public:
  using Storage = std::variant<bool, int64_t, double, std::string, std::vector<double>, std::vector<int64_t>,
                               std::vector<std::string>>;
  SettingValue() = default;
  SettingValue(bool v) : value_(v) {}
  SettingValue(int v) : value_(static_cast<int64_t>(v)) {}
  SettingValue(long v) : value_(static_cast<int64_t>(v)) {}
  SettingValue(long long v) : value_(static_cast<int64_t>(v)) {}
  SettingValue(double v) : value_(v) {}
  SettingValue(const char* v) : value_(std::string(v)) {}
  SettingValue(std::string v) : value_(std::move(v)) {}
  SettingValue(std::vector<double> v) : value_(std::move(v)) {}
  SettingValue(std::vector<int64_t> v) : value_(std::move(v)) {}
  SettingValue(std::vector<std::string> v) : value_(std::move(v)) {}

  /// The value as T: bool, int, int64_t, double, std::string, std::vector<double>,
  /// std::vector<int64_t> or std::vector<std::string>. An integer converts to a number (and a list
  /// of integers to a list of numbers), a number with an integral value to an integer, a string to
  /// a list of one string. Throws whittle::Error (usage) saying what the value is otherwise.
  template <typename T>
  T as() const;
  /// The value as recipe text ("4", "true", "[1, 2]"), for messages.
  std::string text() const;
  const Storage& storage() const { return value_; }

 private:
  Storage value_;
};

template <> bool SettingValue::as<bool>() const;
template <> int SettingValue::as<int>() const;
template <> int64_t SettingValue::as<int64_t>() const;
template <> double SettingValue::as<double>() const;
template <> std::string SettingValue::as<std::string>() const;
template <> std::vector<double> SettingValue::as<std::vector<double>>() const;
template <> std::vector<int64_t> SettingValue::as<std::vector<int64_t>>() const;
template <> std::vector<std::string> SettingValue::as<std::vector<std::string>>() const;

/// The settings given for one set of options (a modifier entry's own keys, a method's, a pass's
/// flags): only the keys given. Defaults live in the options struct (OptionsSchema).
class Settings {
 public:
  bool contains(const std::string& key) const { return values_.count(key) > 0; }
  /// The value of `key`; throws whittle::Error when the entry lacks it.
  const SettingValue& operator[](const std::string& key) const;
  /// The value of `key`, inserted (a default SettingValue, `false`) when absent.
  SettingValue& operator[](const std::string& key) { return values_[key]; }
  const std::map<std::string, SettingValue>& values() const { return values_; }
  bool empty() const { return values_.empty(); }

 private:
  std::map<std::string, SettingValue> values_;
};

/// The type of a recipe value, for validation and docs.
enum class KeyType { kString, kInt, kFloat, kBool, kFloatList, kIntList, kStringList, kMap, kList, kAny };

/// The allowed interval of a numeric recipe value (integers, numbers and the elements of their
/// lists): [lo, hi], either end open or unbounded. Every number must also be finite (no .inf,
/// .nan), whatever its range.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;  ///< lo itself is excluded
  bool hi_open = false;  ///< hi itself is excluded
  /// Any finite value.
  static Range any() { return {}; }
  /// ≥ v.
  static Range at_least(double v) { return {v, std::numeric_limits<double>::infinity(), false, false}; }
  /// > v.
  static Range above(double v) { return {v, std::numeric_limits<double>::infinity(), true, false}; }
  /// [a, b].
  static Range closed(double a, double b) { return {a, b, false, false}; }
  /// [a, b).
  static Range half_open(double a, double b) { return {a, b, false, true}; }
  /// Whether `v` lies inside (and is finite).
  bool contains(double v) const;
  /// The interval as recipe docs print it ("≥ 0", "> 0", "0..1", "[0, 1)"; "" for any()).
  std::string text() const;
};

/// One key of a recipe section: its name, type, default (as text, for docs), and description.
struct KeySpec {
  std::string name;
  KeyType type;
  std::string default_text;
  std::string description;
  std::vector<KeySpec> children;  ///< for kMap
  std::vector<std::string> choices;  ///< allowed string values (empty: any)
  Range range;                       ///< numeric keys: the allowed values (checked before any work)
};

/// "<type name>" for messages and docs ("list of numbers", ...).
const char* key_type_name(KeyType type);

/// How messages name an option: as a recipe key (`key 'target_macs'`) or as the command-line flag
/// that mirrors it (`--target-macs`).
enum class KeyStyle { kRecipe, kFlag };

/// Where a set of options comes from, for messages: `where` names the place ("recipe.yaml:12:
/// modifier 'prune'", "pass 'prune'", or a command, "prune"), `style` how its keys are spelled.
struct OptionSource {
  std::string where;
  KeyStyle style = KeyStyle::kRecipe;
  /// The option `key` as this source spells it: "key 'round_to'" or "--round-to".
  std::string key(const std::string& key) const;
  /// The text that leads a message about `key`: "<where>, key 'round_to'" or "<where>: --round-to".
  std::string about(const std::string& key) const;
};

/// The command-line flag of option `key`: "--" with '_' spelled '-' ("round_to" → "--round-to").
std::string flag_name(const std::string& key);

namespace options_detail {

template <typename T>
struct OptionType;
template <>
struct OptionType<bool> {
  static constexpr KeyType kType = KeyType::kBool;
};
template <>
struct OptionType<int64_t> {
  static constexpr KeyType kType = KeyType::kInt;
};
template <>
struct OptionType<double> {
  static constexpr KeyType kType = KeyType::kFloat;
};
template <>
struct OptionType<std::string> {
  static constexpr KeyType kType = KeyType::kString;
};
template <>
struct OptionType<std::vector<double>> {
  static constexpr KeyType kType = KeyType::kFloatList;
};
template <>
struct OptionType<std::vector<int64_t>> {
  static constexpr KeyType kType = KeyType::kIntList;
};
template <>
struct OptionType<std::vector<std::string>> {
  static constexpr KeyType kType = KeyType::kStringList;
};

template <typename T>
struct Unwrap {
  using type = T;
  static constexpr bool kOptional = false;
};
template <typename T>
struct Unwrap<std::optional<T>> {
  using type = T;
  static constexpr bool kOptional = true;
};

}  // namespace options_detail

/// The recipe keys of a modifier's options struct `Options` (default-constructible; its
/// initializers are the defaults) and the conversion of a recipe entry's settings into it.
template <typename Options>
class OptionsSchema {
 public:
  /// Binds `key` to the field `member` of type T: bool, int64_t, double, std::string,
  /// std::vector of double, int64_t or std::string, or an std::optional of one of these (unset:
  /// a default that depends on other settings). The printed default is the field's value in
  /// Options{}, followed by " (note)" when `note` is given; for an optional field unset in
  /// Options{} it is `note` alone. `choices` restricts a string field. Returns *this.
  template <typename T>
  OptionsSchema& add(std::string key, T Options::*member, std::string description,
                     std::vector<std::string> choices = {}, std::string note = "") {
    using Value = typename options_detail::Unwrap<T>::type;
    const Options defaults{};
    std::string default_text;
    if constexpr (options_detail::Unwrap<T>::kOptional) {
      default_text = (defaults.*member).has_value() ? SettingValue(*(defaults.*member)).text() : note;
      if ((defaults.*member).has_value() && !note.empty()) default_text += " (" + note + ")";
    } else {
      default_text = SettingValue(defaults.*member).text();
      if (!note.empty()) default_text += " (" + note + ")";
    }
    keys_.push_back(KeySpec{key, options_detail::OptionType<Value>::kType, default_text, std::move(description), {}, choices, {}});
    setters_.push_back([member, choices, key](Options& o, const SettingValue& v) {
      Value value = v.as<Value>();
      if constexpr (std::is_same_v<Value, std::string>) {
        if (!choices.empty() && std::find(choices.begin(), choices.end(), value) == choices.end()) {
          std::string all;
          for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
          throw Error("'" + value + "' is not one of " + all, ErrorKind::kUsage);
        }
      }
      o.*member = std::move(value);
    });
    return *this;
  }

  /// Restricts the numeric key added last to `range` (checked with the recipe, before any work,
  /// and by parse()). Every number is checked finite whatever its range. Returns *this.
  OptionsSchema& in_range(Range range) {
    if (!keys_.empty()) keys_.back().range = range;
    return *this;
  }

  /// One KeySpec per bound field, in the order added (ModifierInfo::settings).
  const std::vector<KeySpec>& keys() const { return keys_; }

  /// True when `key` is bound.
  bool has(const std::string& key) const {
    return std::any_of(keys_.begin(), keys_.end(), [&](const KeySpec& k) { return k.name == key; });
  }

  /// Options{} with each key of `settings` set from its value. Throws whittle::Error (usage)
  /// "<where>, key '<key>': ..." for a key that is not bound or a value of the wrong type, not
  /// among the choices, not finite or outside its range.
  Options parse(const Settings& settings, const std::string& where) const {
    return parse(settings, OptionSource{where});
  }
  /// The same, naming the keys as `source` spells them ("<where>: --round-to: ..." for flags).
  Options parse(const Settings& settings, const OptionSource& source) const {
    Options o{};
    parse_into(o, settings, source);
    return o;
  }

  /// Sets the fields of `o` whose keys `settings` gives (others keep their values); errors as parse.
  void parse_into(Options& o, const Settings& settings, const OptionSource& source) const {
    for (const auto& [key, value] : settings.values()) {
      size_t i = 0;
      while (i < keys_.size() && keys_[i].name != key) ++i;
      if (i == keys_.size())
        throw Error(source.where + ": unknown " + (source.style == KeyStyle::kFlag ? "option " : "") + source.key(key),
                    ErrorKind::kUsage);
      try {
        check_numbers(value, keys_[i].range);
        setters_[i](o, value);
      } catch (const Error& e) {
        throw Error(source.about(key) + ": " + e.what(), ErrorKind::kUsage);
      }
    }
  }

  /// Adds the keys of `base`, the schema of a base class of Options, except those in `except`
  /// (a derived options struct that extends another, e.g. the prune modifier's options extend the
  /// prune pass's). Returns *this.
  template <typename Base>
  OptionsSchema& include(const OptionsSchema<Base>& base, const std::vector<std::string>& except = {}) {
    static_assert(std::is_base_of_v<Base, Options>, "include() takes the schema of a base class");
    for (size_t i = 0; i < base.keys_.size(); ++i) {
      if (std::find(except.begin(), except.end(), base.keys_[i].name) != except.end()) continue;
      keys_.push_back(base.keys_[i]);
      setters_.push_back([set = base.setters_[i]](Options& o, const SettingValue& v) { set(static_cast<Base&>(o), v); });
    }
    return *this;
  }

 private:
  static void check_numbers(const SettingValue& value, const Range& range) {
    std::vector<double> numbers;
    const auto& st = value.storage();
    if (const auto* d = std::get_if<double>(&st)) numbers = {*d};
    if (const auto* i = std::get_if<int64_t>(&st)) numbers = {static_cast<double>(*i)};
    if (const auto* v = std::get_if<std::vector<double>>(&st)) numbers = *v;
    if (const auto* v = std::get_if<std::vector<int64_t>>(&st)) numbers.assign(v->begin(), v->end());
    for (double x : numbers)
      if (!range.contains(x))
        throw Error(value.text() + (std::isfinite(x) ? " is outside " + range.text() : " is not a finite number"),
                    ErrorKind::kUsage);
  }

  template <typename>
  friend class OptionsSchema;

  std::vector<KeySpec> keys_;
  std::vector<std::function<void(Options&, const SettingValue&)>> setters_;
};

}  // namespace whittle
