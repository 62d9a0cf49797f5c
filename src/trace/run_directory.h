// A run directory (run_layout.h) listed once: its trace streams, statuses and environment
// fingerprints, by name, and its nodes' manifests and configs. Every verb and phase that reads a run takes its files from here, and
// "not a run" is said here only.
//
//   RunDirectory run;
//   if (Status s = RunDirectory::open(dir, &run); !s.ok()) return s;
//   for (const RunFile& stream : run.traces()) read(stream.path);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "util/status.h"

namespace detaudit::trace {

// One file of streams/ or nodes/: its name without the extension ("r0.main.t-main" for a trace,
// "r0.main" for a status or an environment, "n0" for a node's manifest or config) and its path.
struct RunFile {
  std::string name;
  std::string path;
};

class RunDirectory {
 public:
  // DIR exists, is a directory and has streams/; otherwise one kBadInput error that says which.
  static Status open(const std::string& dir, RunDirectory* out);
  // DIR's streams/ as found, without a word when it is missing (a reader that takes what is
  // there, such as the endings of a run killed early).
  static RunDirectory list(const std::string& dir);

  const std::string& path() const { return path_; }
  std::string streams_dir() const;
  // Sorted by name. Of a temporary (`for (f : RunDirectory::list(d).traces())`), a copy: a
  // reference into it would dangle.
  const std::vector<RunFile>& traces() const& { return traces_; }
  const std::vector<RunFile>& statuses() const& { return statuses_; }
  const std::vector<RunFile>& environments() const& { return environments_; }
  std::vector<RunFile> traces() && { return std::move(traces_); }
  std::vector<RunFile> statuses() && { return std::move(statuses_); }
  std::vector<RunFile> environments() && { return std::move(environments_); }
  // nodes/<node>.json and nodes/<node>.config.json of a run recorded across nodes (`detaudit
  // record`); none for a run of `detaudit run`. Sorted by node.
  const std::vector<RunFile>& node_manifests() const& { return node_manifests_; }
  const std::vector<RunFile>& node_configs() const& { return node_configs_; }
  void node_manifests() && = delete;
  void node_configs() && = delete;
  // run.json and config.json, as paths; whether they exist is the reader's to find.
  std::string run_manifest() const;
  std::string run_config() const;
  const RunFile* trace(const std::string& name) const;
  const RunFile* status(const std::string& process) const;
  // An error when no stream was recorded at all (nothing to compare is not "identical"), naming
  // the first status line, which says why.
  Status require_traces() const;

 private:
  std::error_code scan(const std::string& dir);  // lists DIR's streams/ and nodes/ into this

  std::string path_;
  std::vector<RunFile> traces_, statuses_, environments_, node_manifests_, node_configs_;
};

// The rank of a process or stream name ("r3.main.t-main" -> 3); nullopt when it names none.
std::optional<int64_t> rank_of_name(const std::string& name);

}  // namespace detaudit::trace
