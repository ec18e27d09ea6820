#include "core/registry.h"

#include <algorithm>

namespace whittle {

namespace {

struct RegistryIndex {
  std::mutex mutex;
  std::vector<const RegistryBase*> list;
};

RegistryIndex& index() {
  static RegistryIndex* r = new RegistryIndex;  // never destroyed: registries outlive static destructors
  return *r;
}

}  // namespace

RegistryBase::RegistryBase(std::string kind, std::string plural, ErrorKind unknown_kind)
    : kind_(std::move(kind)), plural_(std::move(plural)), unknown_kind_(unknown_kind) {
  RegistryIndex& r = index();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.list.push_back(this);
}

std::vector<std::string> RegistryBase::names() const {
  ensure_registered();
  return raw_names();
}

RegistryBase::~RegistryBase() {
  RegistryIndex& r = index();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.list.erase(std::remove(r.list.begin(), r.list.end(), this), r.list.end());
}

void RegistryBase::unknown(const std::string& name) const {
  std::string known;
  for (const auto& n : raw_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown " + kind_ + " '" + name + "' (known " + plural_ + ": " + (known.empty() ? "none registered" : known) +
                  ")",
              unknown_kind_);
}

std::vector<const RegistryBase*> all_registries() {
  ensure_registered();
  RegistryIndex& r = index();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.list;
}

const RegistryBase* find_registry(const std::string& plural) {
  for (const RegistryBase* r : all_registries())
    if (r->plural() == plural) return r;
  return nullptr;
}

}  // namespace whittle
