// Where things live in a run directory; shared by the CLI, the interposer and the comparator.
//
//   <out>/run-<i>/run.json                  the CLI: command, config, exit status, timing
//   <out>/run-<i>/config.json               the resolved config the interposer reads
//   <out>/run-<i>/output.log                the target's stdout and stderr
//   <out>/run-<i>/streams/<stream>.dtr      one trace per thread of each process
//   <out>/run-<i>/streams/<process>.env.json  the environment fingerprint of each process
//   <out>/run-<i>/streams/<process>.status  written by the interposer: "attached" or why not
//   <out>/run-<i>/compile-cache/            torch.compile's caches, fresh for each run
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
// Set by a recorded process for the children it starts: its name, and its RANK ("" if none).
inline constexpr const char* kEnvParentProcess = "DETAUDIT_PARENT_PROCESS";
inline constexpr const char* kEnvParentRank = "DETAUDIT_PARENT_RANK";
inline constexpr const char* kStreamsDir = "streams";
inline constexpr const char* kRunJson = "run.json";
inline constexpr const char* kConfigJson = "config.json";
inline constexpr const char* kOutputLog = "output.log";
inline constexpr const char* kTraceExt = ".dtr";
inline constexpr const char* kEnvExt = ".env.json";
inline constexpr const char* kStatusExt = ".status";
inline constexpr const char* kCompileCacheDir = "compile-cache";

inline std::string process_name(long rank, const std::string& role) {
  return "r" + std::to_string(rank) + "." + role;
}
inline std::string stream_name(const std::string& process, const std::string& thread) {
  return process + ".t-" + thread;
}

}  // namespace detaudit::layout
