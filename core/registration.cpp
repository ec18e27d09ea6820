#include "core/registration.h"

#include <atomic>
#include <mutex>
#include <utility>

namespace whittle {

namespace {

struct ModuleRegistrations {
  std::recursive_mutex mutex;
  std::vector<std::pair<std::string, void (*)()>> list;
  size_t done = 0;
  bool running = false;
  std::atomic<bool> pending{false};  ///< a registration was added and has not run yet
};

ModuleRegistrations& module_registrations() {
  static ModuleRegistrations r;
  return r;
}

}  // namespace

void add_module_registration(const std::string& module, void (*registration)()) {
  ModuleRegistrations& r = module_registrations();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  for (const auto& m : r.list)
    if (m.first == module) return;
  r.list.emplace_back(module, registration);
  r.pending.store(true, std::memory_order_release);
}

void ensure_registered() {
  ModuleRegistrations& r = module_registrations();
  // Every registry lookup comes here (op_traits in a forward, too): after start-up there is
  // nothing pending, and the check is one atomic load.
  if (!r.pending.load(std::memory_order_acquire)) return;
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  if (r.running) return;  // a registration looking something up
  r.running = true;
  try {
    while (r.done < r.list.size()) {
      auto fn = r.list[r.done].second;
      ++r.done;
      fn();
    }
    r.pending.store(false, std::memory_order_release);
  } catch (...) {
    r.running = false;
    throw;
  }
  r.running = false;
}

std::vector<std::string> registered_modules() {
  ModuleRegistrations& r = module_registrations();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& m : r.list) out.push_back(m.first);
  return out;
}

}  // namespace whittle
