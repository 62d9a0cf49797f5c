// XXH3-128 built for AVX-512 and for AVX2, from the packaged xxhash.h. Debian's libxxhash is built
// for the x86-64 baseline (SSE2); the vector builds hash 1.6-2x faster. Same digests: XXH3 is
// defined independently of the vector width.
#pragma once

#include <cstddef>
#include <cstdint>

namespace detaudit {

struct Xxh3WideState;

// One vector build's functions.
struct Xxh3Wide {
  const char* isa;             // "avx512", "avx2"
  Xxh3WideState* (*create)();  // ready for update()
  void (*destroy)(Xxh3WideState* s);
  void (*reset)(Xxh3WideState* s);
  void (*update)(Xxh3WideState* s, const void* data, size_t n);
  void (*digest)(const Xxh3WideState* s, uint8_t out[16]);       // canonical (big-endian) bytes
  void (*oneshot)(const void* data, size_t n, uint8_t out[16]);  // the same, in one call
};

// The widest build this CPU runs, or null (then libxxhash hashes).
const Xxh3Wide* xxh3_wide();
// Each build, null where it was not compiled. Run one only on a CPU that has its ISA.
const Xxh3Wide* xxh3_avx512();
const Xxh3Wide* xxh3_avx2();

}  // namespace detaudit
