// The run configuration (docs/config.md): parsed from JSON, validated with errors that name the
// field, overridden by CLI flags, and handed to the interposer as a resolved JSON file.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trace/format.h"
#include "util/status.h"

namespace detaudit {

// A set of non-negative integers from lists and ranges: [0, "2-4", "7-"] or "all".
class RangeSet {
 public:
  static Status parse(const nlohmann::json& j, const std::string& field, RangeSet* out);
  bool all() const { return ranges_.empty(); }
  bool contains(uint64_t v) const;
  uint64_t max_bound() const;  // largest finite upper bound; UINT64_MAX if open or all
  nlohmann::json to_json() const;

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // inclusive; empty = all
};

// Glob with '*' and '?', matched against the recorded op name ("aten::index_put_").
bool glob_match(std::string_view pattern, std::string_view text);

struct TargetConfig {
  std::vector<std::string> command;  // argv: program then arguments
  std::map<std::string, std::string> env;
  std::string cwd;
};

struct SelectConfig {
  RangeSet steps, ranks;
  std::vector<std::string> include_ops, exclude_ops;  // globs; empty include = every op
  std::vector<trace::Phase> phases;                   // empty = every phase
  bool wants_phase(trace::Phase p) const;
  bool wants_op(std::string_view name) const;
};

struct DeterminismConfig {
  std::optional<uint64_t> seed;
  std::string algorithms;  // "on" | "warn" | "off" | "" (leave the program's choice)
  std::optional<int> intra_op_threads;
  // Resolve oneMKL VML's kernels with one serial call each before the program runs: concurrent
  // first calls from intra-op threads can run a low-accuracy kernel (pytorch#188792).
  bool mkl_vml_warm_up = true;
};

struct GateConfig {
  std::string fail_on = "any";  // "any" | "tolerance" | "training" (TrainingCheck)
  // For "tolerance": each statistic within atol + rtol * its scale (classify.cpp, delta_of).
  double rtol = 0, atol = 0;
  // A stream cut short (a run killed mid-step) makes the comparison incomplete, exit 5; with
  // this, what both runs have is compared and passes if it matches.
  bool allow_truncated = false;
  // For "tolerance": N units of the dtype's epsilon at the statistic's scale, added to rtol
  // (float32: 1.19e-7, bfloat16: 7.8e-3), so that one gate fits every dtype.
  double ulp = 0;
};

struct Config {
  TargetConfig target;
  int runs = 1;
  std::string out = "audit";
  SelectConfig select;
  trace::DigestAlgo digest = trace::DigestAlgo::kMd5;
  bool digest_chosen = false;  // by the config or --digest: no default replaces it
  bool stats = true;
  bool inputs = true;
  bool rehash_inputs = false;  // trust no cached input across top-level ops
  // Record only what a step leaves: the optimizer's top-level ops (parameters, gradients and
  // its state) and the loss. A long run at about plain speed, to find the first divergent step.
  bool sentinel = false;
  // With sentinel: steps recorded in full all the same (null: none). How `run --sentinel`
  // records the divergent step with every step before it still watched.
  std::optional<RangeSet> full_steps;
  // The bytes (MiB) a thread's open batch of device digests may hold; 0: a batch per op.
  int64_t device_batch_mib = 256;
  // Each kernel torch.compile generates recorded as an op (hooks/python/), not only its region.
  bool compiled_kernels = true;
  // A run recording every step in full says, once it has this many, what a step costs in disk
  // and time and suggests --sentinel (src/run/recording_watch.h); 0: never.
  int64_t warn_after_steps = 100;
  DeterminismConfig determinism;
  GateConfig gate;
  std::string format = "text";  // report format when runs >= 2
  std::string output;           // report file; empty = stdout
};

Status parse_config(const nlohmann::json& j, Config* out);
Status load_config(const std::string& path, Config* out);
nlohmann::json config_to_json(const Config& c);

}  // namespace detaudit
