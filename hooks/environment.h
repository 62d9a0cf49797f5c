// What a run's result depends on besides its code: the environment fingerprint written beside
// each process's streams, the determinism settings the interposer applies, and RNG state.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace detaudit::hooks {

class ProcessRecorder;

// Applies config.determinism before the program's first op. Returns what it did, for the status.
std::string apply_determinism(const DeterminismConfig& config);
uint32_t determinism_bits();
uint64_t default_rng_digest();
std::string torch_version();
void write_environment(const std::string& path, const ProcessRecorder& proc);

}  // namespace detaudit::hooks
