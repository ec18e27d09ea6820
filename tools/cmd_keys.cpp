// `whittle keys`: every recipe key and modifier setting, with type, default and description
// (--markdown writes the tables of docs/recipes.md).

#include <boost/program_options.hpp>

#include <iostream>

#include "core/error.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "tools/command.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

void list_keys(std::ostream& os, const std::vector<runner::KeySpec>& keys, const std::string& prefix, bool markdown) {
  for (const auto& k : keys) {
    const std::string path = prefix.empty() ? k.name : prefix + "." + k.name;
    if (k.type == runner::KeyType::kMap && !k.children.empty()) {
      if (markdown) os << "| `" << path << "` | section | | | " << k.description << " |\n";
      else os << path << ":  " << k.description << "\n";
      list_keys(os, k.children, path, markdown);
      continue;
    }
    std::string desc = k.description;
    const std::string range = k.range.text();
    if (!k.choices.empty()) {
      desc += " (one of:";
      for (const auto& c : k.choices) desc += " " + c;
      desc += ")";
    }
    if (markdown) {
      os << "| `" << path << "` | " << runner::key_type_name(k.type) << " | " << k.default_text << " | " << range << " | "
         << desc << " |\n";
    } else {
      os << "  " << path << "  (" << runner::key_type_name(k.type) << ", default " << k.default_text
         << (range.empty() ? "" : ", " + range) << ")  " << desc << "\n";
    }
  }
}

}  // namespace

int run_keys(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle keys [--markdown]\n\n"
      "Lists every recipe key and every modifier's settings with type, default and meaning.\n\n"
      "example:\n  whittle keys\n\noptions");
  opts.add_options()("help,h", "this text")("markdown", "print the Markdown tables of docs/recipes.md");
  po::variables_map vm = parse_command_line(args, opts);
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  const bool md = vm.count("markdown") > 0;
  runner::register_builtin_modifiers();
  if (md) std::cout << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  list_keys(std::cout, runner::recipe_schema(), "", md);
  for (const auto& name : runner::modifier_names()) {
    const auto& info = runner::modifier_info(name);
    const std::vector<KeySpec> settings = runner::modifier_settings(info);
    if (md) {
      std::cout << "\n### Modifier `" << name << "`\n\n" << info.description << "\n\n"
                << "Common keys: `name`, `start_epoch`, `end_epoch`, `targets`, `ignore`.\n\n";
      if (!settings.empty()) std::cout << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    } else {
      std::cout << "\nmodifier " << name << ": " << info.description << "\n";
    }
    list_keys(std::cout, settings, "", md);
  }
  return 0;
}

}  // namespace whittle::cli
