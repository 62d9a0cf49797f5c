// Test helpers the unit tests share: a fresh temporary directory, the shipped catalog.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "catalog/catalog.h"

namespace detaudit::testing {

// An empty directory of its own under gtest's temporary directory.
inline std::string fresh_temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(::testing::TempDir()) /
                                  ("detaudit_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

inline std::string shipped_catalog_file() {
  return std::string(DETAUDIT_SOURCE_DIR) + "/configs/catalog.json";
}

// The catalog detaudit ships, loaded once.
inline const Catalog& shipped_catalog() {
  static const Catalog c = [] {
    Catalog c;
    Status s = Catalog::load(shipped_catalog_file(), &c);
    EXPECT_TRUE(s.ok()) << s.message();
    return c;
  }();
  return c;
}

}  // namespace detaudit::testing
