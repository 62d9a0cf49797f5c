// An 8x8 transpose of 32-bit words in AVX2 registers, for callers compiled with AVX2 enabled on
// the function (`__attribute__((target("avx2")))`): MD5's lanes and strided views' gathers.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace detaudit {

// r[i] holds 8 words of row i; afterwards r[j] holds word j of the 8 rows, in row order.
__attribute__((target("avx2"), always_inline)) inline void transpose8x8_epi32(__m256i* r) {
  __m256i t[8], u[8];
  for (int l = 0; l < 8; l += 2) {
    t[l] = _mm256_unpacklo_epi32(r[l], r[l + 1]);      // words 0 1 | 4 5 of rows l, l+1
    t[l + 1] = _mm256_unpackhi_epi32(r[l], r[l + 1]);  // words 2 3 | 6 7
  }
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);          // word 0 | 4 of 4 rows
    u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);      // word 1 | 5
    u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);  // word 2 | 6
    u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);  // word 3 | 7
  }
  for (int w = 0; w < 4; ++w) {
    r[w] = _mm256_permute2x128_si256(u[w], u[4 + w], 0x20);
    r[w + 4] = _mm256_permute2x128_si256(u[w], u[4 + w], 0x31);
  }
}

}  // namespace detaudit
#endif
