// What a run's result depends on besides its code: the environment fingerprint written beside
// each process's streams, the determinism settings the interposer applies, and RNG state.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "trace/format.h"

namespace detaudit::hooks {

// What the fingerprint says of the process itself: the recorder knows it, and passes it down.
struct ProcessFacts {
  long rank = 0;
  std::string role;  // "main", "main.0", ...
  bool python = false;
  trace::DigestAlgo digest = trace::DigestAlgo::kMd5;
};

// Applies config.determinism before the program's first op. Returns what it did, for the status.
std::string apply_determinism(const DeterminismConfig& config);
uint32_t determinism_bits();
uint64_t default_rng_digest();
// The state digest of a CUDA device's default generator (-1: the current device); 0 where it
// cannot be read. Call it only where CUDA is up: for a CUDA tensor, or after cuda_initialized().
uint64_t cuda_rng_digest(int device_index);
// Whether this process has started CUDA (cuInit ran). Never starts it.
bool cuda_initialized();
std::string torch_version();
// Writes the fingerprint (atomically: a temporary file, then rename). Its "cuda" object is filled
// in only where CUDA is already up.
void write_environment(const std::string& path, const ProcessFacts& process);
// At exit: the fingerprint again, if it was written before the program started CUDA.
void rewrite_environment_if_cuda_started(const ProcessFacts& process);

}  // namespace detaudit::hooks
