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
// <process> is "r<rank>.<role>" (role "main", "main.0" for its first forked child, ...) and
// <stream> is "<process>.t<thread-index>".
#pragma once

#include <string>

namespace detaudit::layout {

inline constexpr const char* kEnvRunDir = "DETAUDIT_RUN_DIR";  // the interposer records here
inline constexpr const char* kEnvConfig = "DETAUDIT_CONFIG";   // path of the resolved config
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
inline std::string stream_name(long rank, const std::string& role, unsigned long thread) {
  return process_name(rank, role) + ".t" + std::to_string(thread);
}

}  // namespace detaudit::layout
