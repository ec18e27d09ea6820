#include "export/exporter.h"

#include <algorithm>
#include <optional>
#include <variant>

#include "core/error.h"
#include "core/file_util.h"

namespace whittle {

void register_export_writers();  // writers.cpp: the exporters and the per-op forms

// The export module's registration lives here, beside the registry every user of an export format
// calls, so that linking the registry links the exporters too (a program that only runs recipes
// references no writer directly).
WHITTLE_REGISTER_MODULE("export", &register_export_writers)

Registry<Exporter>& exporters() {
  static Registry<Exporter> r("exporter", "exporters", [](const Exporter& e) { return e.description(); });
  return r;
}

void register_exporter(std::unique_ptr<Exporter> exporter) {
  if (!exporter) throw Error("register_exporter: no exporter");
  if (exporter->extensions().empty()) throw Error("register_exporter: '" + exporter->name() + "' has no file extension");
  const std::string name = exporter->name();
  exporters().add(name, std::move(exporter));
}

const Exporter& exporter(const std::string& name) { return exporters().get(name); }

const Exporter* exporter_for_path(const std::string& path) {
  const std::string ext = file_extension(path);
  if (ext.empty()) return nullptr;
  for (const auto& name : exporters().names()) {
    const Exporter& e = exporters().get(name);
    const auto exts = e.extensions();
    if (std::find(exts.begin(), exts.end(), ext) != exts.end()) return &e;
  }
  return nullptr;
}

void check_export_options(const Exporter& e, const Settings& options, const std::string& where) {
  const auto keys = e.option_keys();
  for (const auto& entry : options.values()) {
    const std::string& key = entry.first;
    const SettingValue& value = entry.second;
    const auto own = std::find_if(keys.begin(), keys.end(), [&](const KeySpec& k) { return k.name == key; });
    if (own != keys.end()) {
      // Numbers inside the key's range, before any model is loaded.
      const auto& st = value.storage();
      std::optional<double> number;
      if (const auto* d = std::get_if<double>(&st)) number = *d;
      if (const auto* i = std::get_if<int64_t>(&st)) number = static_cast<double>(*i);
      if (number && !own->range.contains(*number))
        throw Error(where + ", key '" + key + "': " + value.text() + " is outside " + own->range.text(), ErrorKind::kUsage);
      continue;
    }
    std::string owners;
    for (const auto& name : exporters().names())
      for (const auto& k : exporters().get(name).option_keys())
        if (k.name == key) owners += (owners.empty() ? "" : ", ") + name;
    throw Error(where + ": " + key + " applies to " + (owners.empty() ? "no format" : "format " + owners) + " only, not " +
                    e.name(),
                ErrorKind::kUsage);
  }
}

}  // namespace whittle
