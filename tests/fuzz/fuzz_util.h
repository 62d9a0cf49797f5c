// Shared by the libFuzzer harnesses: a scratch directory per fuzzing process, removed at exit.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace detaudit::fuzz {

[[noreturn]] inline void die(const std::string& why) {
  std::fprintf(stderr, "fuzz harness: %s\n", why.c_str());
  std::abort();
}

// Under TMPDIR, else in /dev/shm (writing a file per input to a disk can be 20 times slower);
// each -jobs worker gets its own. tests/fuzz/run.sh points TMPDIR at a directory in /dev/shm.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string parent = tmp && *tmp ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string pattern = parent + "/detaudit_fuzz_XXXXXX";
    if (!mkdtemp(pattern.data())) die("cannot create a scratch directory in " + pattern);
    static std::string keep = pattern;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return pattern;
  }();
  return dir;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) die("cannot write " + path);
}

}  // namespace detaudit::fuzz
