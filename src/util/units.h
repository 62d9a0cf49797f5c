// Quantities as people read them.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace detaudit {

// "1.2 GB", "512 B": decimal units, one decimal.
inline std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = double(b);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

// "45 s", "12 min", "3.5 h".
inline std::string human_seconds(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.0f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

}  // namespace detaudit
