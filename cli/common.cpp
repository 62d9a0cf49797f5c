// Shared by the verbs: error printing, and where the interposer and catalog live.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "cli/verbs.h"
#include "diff/diff.h"
#include "diff/report_model.h"

namespace detaudit::cli {
namespace {

// <prefix> of <prefix>/bin/detaudit, for the build tree and the install tree alike.
std::filesystem::path prefix_dir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return exe.parent_path().parent_path();
}

}  // namespace

int report_error(const Status& status) {
  fmt::print(stderr, "detaudit: error: {}\n", status.message());
  return int(status.code());
}

void say_if_incomplete(const DiffReport& report) {
  if (gate_exit_code(report) != ExitCode::kIncomplete) return;
  fmt::print(stderr,
             "detaudit: incomplete: {}{}; exit 5 (--allow-truncated passes on what both "
             "runs have)\n",
             report.not_compared.front(),
             report.not_compared.size() > 1
                 ? fmt::format(", and {} more", report.not_compared.size() - 1)
                 : "");
}

std::string explicit_hooks_library() {
  const char* env = std::getenv("DETAUDIT_HOOKS");
  return env ? env : "";
}

std::string interposers_dir() { return (prefix_dir() / DETAUDIT_LIB_SUBDIR).string(); }

std::string source_dir() {
  std::error_code ec;
  return std::filesystem::exists(DETAUDIT_SOURCE_DIR, ec) ? DETAUDIT_SOURCE_DIR
                                                          : "<detaudit source>";
}

std::string catalog_path() {
  if (const char* env = std::getenv("DETAUDIT_CATALOG"); env && *env) return env;
  return (prefix_dir() / DETAUDIT_SHARE_SUBDIR / "catalog.json").string();
}

}  // namespace detaudit::cli
