// XXH3-128 built for AVX-512, from the packaged xxhash.h. Debian's libxxhash is built for the
// x86-64 baseline (SSE2); the wide build hashes 1.6-2x faster. Same digests: XXH3 is defined
// independently of the vector width.
//
// Call nothing here unless xxh3_wide_available().
#pragma once

#include <cstddef>
#include <cstdint>

namespace detaudit {

bool xxh3_wide_available();  // the CPU has AVX-512F and the build has the wide code
bool xxh3_wide_compiled();   // the build has it (xxh3_wide.cpp was compiled for AVX-512F)

struct Xxh3WideState;
Xxh3WideState* xxh3_wide_create();
void xxh3_wide_free(Xxh3WideState* s);
void xxh3_wide_reset(Xxh3WideState* s);
void xxh3_wide_update(Xxh3WideState* s, const void* data, size_t n);
void xxh3_wide_digest(const Xxh3WideState* s, uint8_t out[16]);  // canonical (big-endian) bytes
void xxh3_wide_oneshot(const void* data, size_t n, uint8_t out[16]);  // the same, in one call

}  // namespace detaudit
