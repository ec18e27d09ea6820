#pragma once
// The one generic registry. Every kind of thing a module or a user adds to whittle (ops, weight
// transforms, activation quantizers, quantizer methods, calibrators, passes, modifiers,
// exporters) is an entry of a Registry<Entry>, registered by the module that owns it through its
// registration function (core/registration.h), looked up by name, and listed by `whittle inspect`
// (`--ops`, `--transforms`, `--methods`, `--passes`, `--modifiers`, `--exporters`, ...).
//
//   struct Exporter { std::string name, description; ... };
//   Registry<Exporter>& exporters() {
//     static Registry<Exporter> r("exporter", "exporters", [](const Exporter& e) { return e.description; });
//     return r;
//   }
//   exporters().add("onnx", std::make_unique<Exporter>(...));   // in the module's registration
//   const Exporter& e = exporters().get("onnx");                  // throws, listing the known ones
//
// Entries are held by pointer and never destroyed while the process runs (a replaced entry is
// kept aside), so a reference returned by get() stays valid even when a later registration
// replaces the entry. Every lookup first runs the pending module registrations
// (ensure_registered), so linking a module is enough to find its entries.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/registration.h"

namespace whittle {

/// What every registry says about itself, whatever its entry type: for `whittle inspect` and for
/// the messages that list the known names.
class RegistryBase {
 public:
  /// `kind` names one entry in messages ("op", "quantizer method"); `plural` is the registry's
  /// name in listings and inspect's flag ("ops", "methods"). `unknown_kind`: the ErrorKind of an
  /// unknown name (usage for names users type, runtime for names read from a file, as op kinds).
  RegistryBase(std::string kind, std::string plural, ErrorKind unknown_kind = ErrorKind::kUsage);
  /// Leaves the index of all_registries().
  virtual ~RegistryBase();
  RegistryBase(const RegistryBase&) = delete;
  RegistryBase& operator=(const RegistryBase&) = delete;

  const std::string& kind() const { return kind_; }
  const std::string& plural() const { return plural_; }
  /// Registered names, sorted (after the pending module registrations).
  std::vector<std::string> names() const;
  /// The one-line description of entry `name`; throws like lookup.
  virtual std::string description(const std::string& name) const = 0;
  /// True when an entry `name` is registered.
  virtual bool contains(const std::string& name) const = 0;

 protected:
  /// Registered names, sorted, without running pending registrations (safe inside one).
  virtual std::vector<std::string> raw_names() const = 0;
  /// Throws whittle::Error "unknown <kind> '<name>' (known <plural>: a, b, c)" of the registry's
  /// unknown_kind.
  [[noreturn]] void unknown(const std::string& name) const;

 private:
  std::string kind_;
  std::string plural_;
  ErrorKind unknown_kind_;
};

/// Every registry created so far, in order of creation (registries are function-local statics of
/// the modules that own them, created on first use; ensure_registered() creates all of a linked
/// module's).
std::vector<const RegistryBase*> all_registries();
/// The registry whose plural is `plural` ("ops"); nullptr when none.
const RegistryBase* find_registry(const std::string& plural);

/// A registry of entries of type Entry under unique names. Thread-safe: registration and lookup
/// may run from any thread; entries must not be modified after registration except through
/// get_mutable by their owner during registration.
template <typename Entry>
class Registry final : public RegistryBase {
 public:
  using Describe = std::function<std::string(const Entry&)>;

  Registry(std::string kind, std::string plural, Describe describe, ErrorKind unknown_kind = ErrorKind::kUsage)
      : RegistryBase(std::move(kind), std::move(plural), unknown_kind), describe_(std::move(describe)) {}

  /// Adds `entry` under `name`, replacing an entry of that name (the old one stays alive, so
  /// references to it stay valid). Returns the stored entry. Throws whittle::Error for an empty
  /// name or a null entry.
  Entry& add(const std::string& name, std::unique_ptr<Entry> entry) {
    if (name.empty()) throw Error("register " + kind() + ": empty name");
    if (!entry) throw Error("register " + kind() + " '" + name + "': no entry");
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = entries_[name];
    if (slot) replaced_.push_back(std::move(slot));
    slot = std::move(entry);
    return *slot;
  }
  /// Adds `entry` (for plain struct entries; abstract entry types are added as unique_ptr).
  template <typename E = Entry, typename = std::enable_if_t<!std::is_abstract_v<E>>>
  Entry& add(const std::string& name, E entry) {
    return add(name, std::make_unique<Entry>(std::move(entry)));
  }

  /// The entry `name`. Throws whittle::Error naming it and listing the known names.
  const Entry& get(const std::string& name) const {
    if (const Entry* e = find(name)) return *e;
    unknown(name);
  }
  /// Mutable access for the entry's owner while it registers (pending registrations are not run,
  /// so it is safe inside one); throws like get.
  Entry& get_mutable(const std::string& name) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = entries_.find(name);
      if (it != entries_.end()) return *it->second;
    }
    unknown(name);
  }
  /// The entry `name`, or nullptr.
  const Entry* find(const std::string& name) const {
    ensure_registered();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : it->second.get();
  }
  bool contains(const std::string& name) const override { return find(name) != nullptr; }
  std::string description(const std::string& name) const override { return describe_(get(name)); }
  /// Calls `fn(name, entry)` for every entry, in name order (a snapshot: registrations made by
  /// `fn` are not visited).
  void for_each(const std::function<void(const std::string&, const Entry&)>& fn) const {
    for (const auto& name : names()) fn(name, get(name));
  }

 protected:
  std::vector<std::string> raw_names() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& kv : entries_) out.push_back(kv.first);
    return out;
  }

 private:
  Describe describe_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;
  std::vector<std::unique_ptr<Entry>> replaced_;
};

}  // namespace whittle
