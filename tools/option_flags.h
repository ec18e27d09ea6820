#pragma once
// Command-line flags made from option keys (core/options.h), so that a command that mirrors a
// pass or an exporter takes the same options under the same names, declared once:
//   key_with_underscores → --key-with-dashes; a boolean that defaults to true → --no-key, any other
//   boolean → --key; every other value as text, typed by its KeySpec (lists comma-separated).
//
//   OptionFlags flags;
//   flags.add(opts, pass_info("prune").options);
//   po::variables_map vm = parse_command_line(args, opts, ...);
//   Settings given = flags.settings(vm, "prune");   // only the flags given

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/options.h"

namespace whittle::cli {

/// The flags of a set of option keys, and the Settings a parsed command line gives for them.
class OptionFlags {
 public:
  /// Adds one flag for each of `keys` to `opts` (a key added before is skipped), its help line
  /// "<owner>: <description> (default D, choices, range)" (no owner: the description alone).
  void add(boost::program_options::options_description& opts, const std::vector<KeySpec>& keys,
           const std::string& owner = "");
  /// The flag of `key` as add() made it ("--no-fold", "--round-to").
  std::string flag(const std::string& key) const;
  /// The settings the command line `vm` gave for the added keys: only the flags given. A value is
  /// typed by its key: an integer or a number must be a finite number ("2", "0.5", "1e-3"), a list
  /// is comma-separated. Throws whittle::Error (usage) "<command>: --flag 'text' is not a finite
  /// number". Ranges and choices are checked by the schema that reads the settings.
  Settings settings(const boost::program_options::variables_map& vm, const std::string& command) const;

 private:
  std::map<std::string, KeySpec> keys_;  // key → its spec
  std::vector<std::string> order_;
};

/// "a,b,,c" → {"a", "b", "c"}: the comma-separated items of a flag's value, empty ones dropped.
std::vector<std::string> split_commas(const std::string& text);

}  // namespace whittle::cli
