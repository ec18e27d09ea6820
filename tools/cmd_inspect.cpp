// `whittle inspect`: placeholder wiring replaced below once the zoo exists.
#include "tools/command.h"
#include <iostream>
namespace whittle::cli {
int run_inspect(const std::vector<std::string>& args) { std::cerr << "inspect: no models yet\n"; return 2; }
}
