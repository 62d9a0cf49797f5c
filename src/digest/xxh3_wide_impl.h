// The body of one vector build of XXH3-128, included once per ISA by xxh3_avx512.cpp and
// xxh3_avx2.cpp, each compiled for its ISA (src/CMakeLists.txt): every function here may use it,
// so only xxh3_wide() in hashers.cpp decides which runs. DETAUDIT_XXH3_VECTOR names xxhash's
// vector code, DETAUDIT_XXH3_BUILD the function that hands out this build.
#define XXH_INLINE_ALL  // the whole implementation, static in its file: no clash with libxxhash
#define XXH_VECTOR DETAUDIT_XXH3_VECTOR
#include <xxhash.h>

#include "digest/xxh3_wide.h"

namespace detaudit {

struct Xxh3WideState {
  XXH3_state_t* state;
};

namespace {

Xxh3WideState* create() {
  auto* s = new Xxh3WideState{XXH3_createState()};
  XXH3_128bits_reset(s->state);
  return s;
}

void destroy(Xxh3WideState* s) {
  XXH3_freeState(s->state);
  delete s;
}

void reset(Xxh3WideState* s) { XXH3_128bits_reset(s->state); }

void update(Xxh3WideState* s, const void* data, size_t n) {
  XXH3_128bits_update(s->state, data, n);
}

void digest(const Xxh3WideState* s, uint8_t out[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s->state));
  for (int i = 0; i < 16; ++i) out[i] = c.digest[i];
}

void oneshot(const void* data, size_t n, uint8_t out[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
  for (int i = 0; i < 16; ++i) out[i] = c.digest[i];
}

}  // namespace

const Xxh3Wide* DETAUDIT_XXH3_BUILD() {
  static const Xxh3Wide build{DETAUDIT_XXH3_ISA, create, destroy, reset, update, digest, oneshot};
  return &build;
}

}  // namespace detaudit
