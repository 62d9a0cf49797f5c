#include "trace/run_directory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "run_layout.h"

namespace detaudit::trace {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void sort_by_name(std::vector<RunFile>* files) {
  std::sort(files->begin(), files->end(),
            [](const RunFile& a, const RunFile& b) { return a.name < b.name; });
}

const RunFile* find_by_name(const std::vector<RunFile>& files, const std::string& name) {
  auto it = std::lower_bound(files.begin(), files.end(), name,
                             [](const RunFile& f, const std::string& n) { return f.name < n; });
  return it != files.end() && it->name == name ? &*it : nullptr;
}

}  // namespace

Status RunDirectory::open(const std::string& dir, RunDirectory* out) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    return Status::error(fmt::format("{}: no such run directory", dir), ExitCode::kBadInput);
  if (!fs::is_directory(dir, ec))
    return Status::error(fmt::format("{}: not a directory", dir), ExitCode::kBadInput);
  const fs::path streams = fs::path(dir) / layout::kStreamsDir;
  if (!fs::is_directory(streams, ec))
    return Status::error(fmt::format("{}: not a run directory (no {}/)", dir, layout::kStreamsDir),
                         ExitCode::kBadInput);
  // A listing cut short by an error would compare part of a run as if it were all of it.
  if (std::error_code listing = out->scan(dir))
    return Status::error(fmt::format("{}: {}", streams.string(), listing.message()),
                         ExitCode::kBadInput);
  return Status();
}

RunDirectory RunDirectory::list(const std::string& dir) {
  RunDirectory run;
  run.scan(dir);
  return run;
}

std::error_code RunDirectory::scan(const std::string& dir) {
  *this = RunDirectory();
  path_ = dir;
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(dir) / layout::kStreamsDir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string file = it->path().filename().string();
    for (auto [ext, files] :
         {std::pair{layout::kTraceExt, &traces_}, std::pair{layout::kStatusExt, &statuses_},
          std::pair{layout::kEnvExt, &environments_}}) {
      const std::string suffix = ext;
      if (!ends_with(file, suffix)) continue;
      files->push_back({file.substr(0, file.size() - suffix.size()), it->path().string()});
      break;
    }
  }
  // nodes/ is optional: a run of `detaudit run` has none, and a listing error there loses no
  // stream.
  std::error_code nodes_ec;
  for (fs::directory_iterator it(fs::path(dir) / layout::kNodesDir, nodes_ec), end;
       !nodes_ec && it != end; it.increment(nodes_ec)) {
    const std::string file = it->path().filename().string();
    if (ends_with(file, layout::kNodeConfigExt))
      node_configs_.push_back(
          {file.substr(0, file.size() - std::string(layout::kNodeConfigExt).size()),
           it->path().string()});
    else if (ends_with(file, ".json"))
      node_manifests_.push_back({file.substr(0, file.size() - 5), it->path().string()});
  }
  for (auto* files : {&traces_, &statuses_, &environments_, &node_manifests_, &node_configs_})
    sort_by_name(files);
  return ec;
}

std::string RunDirectory::streams_dir() const {
  return (fs::path(path_) / layout::kStreamsDir).string();
}

std::string RunDirectory::run_manifest() const { return layout::manifest_path(path_, ""); }

std::string RunDirectory::run_config() const { return layout::config_path(path_, ""); }

const RunFile* RunDirectory::trace(const std::string& name) const {
  return find_by_name(traces_, name);
}

const RunFile* RunDirectory::status(const std::string& process) const {
  return find_by_name(statuses_, process);
}

Status RunDirectory::require_traces() const {
  if (!traces_.empty()) return Status();
  std::string why;
  if (!statuses_.empty()) {
    std::ifstream in(statuses_.front().path);
    std::string line;
    std::getline(in, line);
    why = fmt::format(" ({}{}: {})", statuses_.front().name, layout::kStatusExt, line);
  }
  return Status::error(fmt::format("{}: no trace stream in {}/ (nothing was recorded){}", path_,
                                   layout::kStreamsDir, why),
                       ExitCode::kBadInput);
}

std::optional<int64_t> rank_of_name(const std::string& name) {
  if (name.size() < 2 || name[0] != 'r') return std::nullopt;
  char* end = nullptr;
  const long long rank = std::strtoll(name.c_str() + 1, &end, 10);
  if (end == name.c_str() + 1 || (*end != '\0' && *end != '.')) return std::nullopt;
  return rank;
}

}  // namespace detaudit::trace
