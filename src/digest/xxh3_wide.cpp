// Compiled with AVX-512F enabled (src/CMakeLists.txt): every function here may use it, so only
// xxh3_wide_available(), in digest.cpp, decides whether they run.
#define XXH_INLINE_ALL  // the whole implementation, static in this file: no clash with libxxhash
#if defined(__AVX512F__)
#define XXH_VECTOR XXH_AVX512
#endif
#include <xxhash.h>

#include "digest/xxh3_wide.h"

namespace detaudit {

struct Xxh3WideState {
  XXH3_state_t* state;
};

bool xxh3_wide_compiled() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

Xxh3WideState* xxh3_wide_create() { return new Xxh3WideState{XXH3_createState()}; }

void xxh3_wide_free(Xxh3WideState* s) {
  XXH3_freeState(s->state);
  delete s;
}

void xxh3_wide_reset(Xxh3WideState* s) { XXH3_128bits_reset(s->state); }

void xxh3_wide_update(Xxh3WideState* s, const void* data, size_t n) {
  XXH3_128bits_update(s->state, data, n);
}

void xxh3_wide_digest(const Xxh3WideState* s, uint8_t out[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s->state));
  for (int i = 0; i < 16; ++i) out[i] = c.digest[i];
}

void xxh3_wide_oneshot(const void* data, size_t n, uint8_t out[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
  for (int i = 0; i < 16; ++i) out[i] = c.digest[i];
}

}  // namespace detaudit
