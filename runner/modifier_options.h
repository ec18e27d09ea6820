#pragma once
// Typed modifier options. An OptionsSchema binds each field of a modifier's options struct to a
// recipe key: the key's type and its printed default (`whittle keys`, docs/recipes.md) come from
// the field's type and from the struct's initializer, so every default is written once, and
// parse() turns a recipe entry's settings into the struct.
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
//   info.settings = schema().keys();   // KeySpecs: sparsity number 0.5, criterion string l1
//   PruneOptions o = schema().parse(spec.settings, spec.location + ": modifier 'prune'");

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/error.h"
#include "runner/recipe.h"

namespace whittle::runner {

namespace detail {

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

}  // namespace detail

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
    using Value = typename detail::Unwrap<T>::type;
    const Options defaults{};
    std::string default_text;
    if constexpr (detail::Unwrap<T>::kOptional) {
      default_text = (defaults.*member).has_value() ? SettingValue(*(defaults.*member)).text() : note;
      if ((defaults.*member).has_value() && !note.empty()) default_text += " (" + note + ")";
    } else {
      default_text = SettingValue(defaults.*member).text();
      if (!note.empty()) default_text += " (" + note + ")";
    }
    keys_.push_back(KeySpec{key, detail::OptionType<Value>::kType, default_text, std::move(description), {}, choices, {}});
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

  /// Options{} with each key of `settings` set from its value. Throws whittle::Error (usage)
  /// "<where>, key '<key>': ..." for a key that is not bound or a value of the wrong type, not
  /// among the choices, not finite or outside its range.
  Options parse(const ModifierSettings& settings, const std::string& where) const {
    Options o{};
    for (const auto& [key, value] : settings.values()) {
      size_t i = 0;
      while (i < keys_.size() && keys_[i].name != key) ++i;
      if (i == keys_.size()) throw Error(where + ": unknown key '" + key + "'", ErrorKind::kUsage);
      try {
        check_numbers(value, keys_[i].range);
        setters_[i](o, value);
      } catch (const Error& e) {
        throw Error(where + ", key '" + key + "': " + e.what(), ErrorKind::kUsage);
      }
    }
    return o;
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

  std::vector<KeySpec> keys_;
  std::vector<std::function<void(Options&, const SettingValue&)>> setters_;
};

}  // namespace whittle::runner
