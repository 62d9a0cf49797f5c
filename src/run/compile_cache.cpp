#include "run/compile_cache.h"

#include <fmt/format.h>

#include <filesystem>
#include <system_error>

namespace detaudit::run {
namespace fs = std::filesystem;

namespace {

// Copies `from` into the new folder `to`: hard links first (inductor and triton replace a
// cache file by renaming a new one over it, so a link never writes into the user's copy).
std::error_code copy_cache(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (ec) return ec;
  for (auto how : {fs::copy_options::create_hard_links, fs::copy_options::none}) {
    fs::remove_all(to, ec);
    ec.clear();
    fs::copy(from, to, fs::copy_options::recursive | how, ec);
    if (!ec) return ec;
  }
  std::error_code removed;
  fs::remove_all(to, removed);  // a run starts from all of the cache or none of it
  return ec;
}

}  // namespace

std::vector<std::string> give_run_its_compile_caches(std::vector<std::string>* env,
                                                     const std::string& cache_root) {
  std::vector<std::string> failures;
  for (const CompileCacheVariable& var : kCompileCacheVariables) {
    const fs::path own = fs::path(cache_root) / var.folder;
    const std::string prefix = std::string(var.name) + "=";
    auto entry = env->begin();
    while (entry != env->end() && entry->rfind(prefix, 0) != 0) ++entry;
    if (entry == env->end()) {
      env->push_back(prefix + own.string());
      continue;
    }
    const fs::path chosen = entry->substr(prefix.size());
    *entry = prefix + own.string();
    std::error_code ec;
    if (chosen.empty() || !fs::is_directory(chosen, ec)) continue;  // nothing to start from
    if (std::error_code copied = copy_cache(chosen, own))
      failures.push_back(fmt::format(
          "{}={} could not be copied into {} ({}): this run's compile cache starts empty; free "
          "space there or unset {}",
          var.name, chosen.string(), own.string(), copied.message(), var.name));
  }
  return failures;
}

}  // namespace detaudit::run
