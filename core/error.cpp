#include "core/error.h"

namespace whittle {

std::string message_of(const std::exception& e) {
  std::string m = e.what();
  for (const char* marker : {"Exception raised from", "\nframe #"}) {
    const size_t at = m.find(marker);
    if (at != std::string::npos) m.resize(at);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ' || m.back() == '\r')) m.pop_back();
  return m;
}

}  // namespace whittle
