// Environment differences between two runs: each process's streams/<process>.env.json is
// flattened to dotted keys ("determinism.deterministic_algorithms", "env.OMP_NUM_THREADS") and
// compared key by key, leaving out volatile keys (pid, times, paths of the run directory).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diff/report_model.h"
#include "trace/run_directory.h"
#include "util/status.h"

namespace detaudit {

// The key of an environment difference that says a process ran in one run only.
inline constexpr const char* kProcessPresence = "(process)";

// Flattens nested objects to dotted keys; arrays and scalars are kept as JSON text.
void flatten_json(const nlohmann::json& j, const std::string& prefix,
                  std::map<std::string, std::string>* out);

// at::show_config()'s text as one key a component or setting ("build_config.BLAS_INFO": "mkl",
// "build_config.Intel(R) MKL-DNN": "v3.12.0 (Git Hash ...)", "build_config.NNPACK is enabled":
// "yes"), so that two torch builds differ by the few lines that do, not by the whole text.
void split_build_config(const std::string& text, std::map<std::string, std::string>* out);

// True for keys whose values differ between any two runs by design.
bool volatile_env_key(const std::string& key);

// Reads every <process>.env.json of a run's streams directory: process name -> flat keys.
// A file that is not valid JSON is an error (exit 3).
Status load_environment(const trace::RunDirectory& run,
                        std::map<std::string, std::map<std::string, std::string>>* out);

// How early an environment difference is listed, the likeliest cause of a numerics change first:
// the torch build and the libraries it carries, the GPU and CUDA, thread counts, determinism
// settings, seeds, the world size, the rest, then the command line and compiler flags.
int suspect_rank(const std::string& key);

// The differences, process by process, in suspect_rank's order; run directory paths are replaced before comparing.
std::vector<EnvDifference> diff_environment(
    const std::map<std::string, std::map<std::string, std::string>>& a, const std::string& run_a,
    const std::map<std::string, std::map<std::string, std::string>>& b, const std::string& run_b);

}  // namespace detaudit
