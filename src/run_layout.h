// Where things live in a run directory; shared by the CLI, the interposer and the comparator.
//
//   <out>/run-<i>/run.json                  the CLI: command, config, exit status, timing
//   <out>/run-<i>/config.json               the resolved config the interposer reads
//   <out>/run-<i>/output.log                the target's stdout and stderr
//   <out>/run-<i>/streams/<stream>.dtr      one trace per thread of each process
//   <out>/run-<i>/streams/<process>.env.json  the environment fingerprint of each process
//   <out>/run-<i>/streams/<process>.status  written by the interposer: "attached" or why not
//   <out>/run-<i>/streams/<process>.progress  the step it is in ("step N"), for the launcher
//   <out>/run-<i>/compile-cache/            torch.compile's caches, fresh for each run
//
// A run recorded across nodes (`detaudit record`, one per node or SLURM task) has no run.json or
// config.json: each launcher writes its own, named for its node.
//   <run>/nodes/<node>.json                 like run.json, for what this launcher started
//   <run>/nodes/<node>.config.json          the config its interposers read
//   <run>/compile-cache/<node>/             its torch.compile caches
//
// <process> is "r<rank>.<role>": role "main", "main.0" for its first forked child (a DataLoader
// worker), "main.<program>" for a recorded child it started. <stream> is "<process>.t-<thread>":
// thread "main", a Python thread's name, a named library thread ("pt_autograd_0"), or "thread".
// A name claimed twice takes "~<k>" (hooks/process/stream_identity.h).
#pragma once

#include <string>

namespace detaudit::layout {

inline constexpr const char* kEnvRunDir = "DETAUDIT_RUN_DIR";  // the interposer records here
inline constexpr const char* kEnvConfig = "DETAUDIT_CONFIG";   // path of the resolved config
// LD_PRELOAD names the preload shim (src/preload/preload.c), which loads this interposer into the
// processes that can run torch; the shim lies in the folder above the interposers' torch/.
inline constexpr const char* kEnvInterposer = "DETAUDIT_INTERPOSER";
inline constexpr const char* kPreloadLibrary = "libdetaudit_preload.so";
// <lib>/detaudit/python: the interposer's Python side (hooks/python/), first on PYTHONPATH.
inline constexpr const char* kPythonHooksDir = "python";
// Set by a recorded process for the children it starts: its name, and its RANK ("" if none).
inline constexpr const char* kEnvParentProcess = "DETAUDIT_PARENT_PROCESS";
inline constexpr const char* kEnvParentRank = "DETAUDIT_PARENT_RANK";
// The node a process's launcher recorded it for (`detaudit record`), for its fingerprint.
inline constexpr const char* kEnvNode = "DETAUDIT_NODE";
// `detaudit resume`: "stop" or "resume" (the process it stops at step K, the one resumed from
// there), K, and the directory the checkpoint goes into (hooks/python/detaudit_resume.py). A
// resumed process counts its steps from 0 but selects them by the run's count (K on).
inline constexpr const char* kEnvResume = "DETAUDIT_RESUME";
inline constexpr const char* kEnvResumeAt = "DETAUDIT_RESUME_AT";
inline constexpr const char* kEnvResumeCheckpoint = "DETAUDIT_RESUME_CKPT";
inline constexpr const char* kStreamsDir = "streams";
inline constexpr const char* kRunJson = "run.json";
inline constexpr const char* kConfigJson = "config.json";
inline constexpr const char* kOutputLog = "output.log";
inline constexpr const char* kTraceExt = ".dtr";
inline constexpr const char* kEnvExt = ".env.json";
inline constexpr const char* kStatusExt = ".status";
inline constexpr const char* kProgressExt = ".progress";
inline constexpr const char* kCompileCacheDir = "compile-cache";
inline constexpr const char* kNodesDir = "nodes";
inline constexpr const char* kNodeConfigExt = ".config.json";

inline std::string process_name(long rank, const std::string& role) {
  return "r" + std::to_string(rank) + "." + role;
}
// run.json, or a node's own manifest and config in a run recorded across nodes.
inline std::string manifest_path(const std::string& run_dir, const std::string& node) {
  return node.empty() ? run_dir + "/" + kRunJson : run_dir + "/" + kNodesDir + "/" + node + ".json";
}
inline std::string config_path(const std::string& run_dir, const std::string& node) {
  return node.empty() ? run_dir + "/" + kConfigJson
                      : run_dir + "/" + kNodesDir + "/" + node + kNodeConfigExt;
}
inline std::string compile_cache_path(const std::string& run_dir, const std::string& node) {
  return node.empty() ? run_dir + "/" + kCompileCacheDir
                      : run_dir + "/" + kCompileCacheDir + "/" + node;
}
inline std::string stream_name(const std::string& process, const std::string& thread) {
  return process + ".t-" + thread;
}

}  // namespace detaudit::layout
