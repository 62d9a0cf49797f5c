#include "digest/md5_lanes.h"

#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>

#include "digest/avx2_transpose.h"
#endif

namespace detaudit {

namespace {
constexpr uint32_t kInit[4] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
}  // namespace

void Md5Lanes::reset() {
  for (size_t l = 0; l < kLanes; ++l) restart_lane(l);
}

void Md5Lanes::restart_lane(size_t lane) {
  for (int w = 0; w < 4; ++w) state_[w][lane] = kInit[w];
}

void Md5Lanes::move_lane(size_t from, size_t to) {
  for (int w = 0; w < 4; ++w) state_[w][to] = state_[w][from];
}

void Md5Lanes::lane_digest(size_t lane, uint8_t out[16]) const {
  for (int w = 0; w < 4; ++w) std::memcpy(out + 4 * w, &state_[w][lane], 4);  // little-endian
}

#if defined(__x86_64__)

namespace {

// RFC 1321: the sine table, the per-round rotations, and the message word each round reads.
constexpr uint32_t kK[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
constexpr int kS[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                        5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                        4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                        6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
constexpr int message_word(int i) {
  return i < 16 ? i : i < 32 ? (5 * i + 1) % 16 : i < 48 ? (3 * i + 5) % 16 : (7 * i) % 16;
}

#define DETAUDIT_AVX512 __attribute__((target("avx512f")))

// One round on all lanes. The four boolean functions are single ternary-logic instructions:
// F = b ? c : d, G = d ? b : c, H = b ^ c ^ d, I = c ^ (b | ~d).
template <int I>
DETAUDIT_AVX512 inline __attribute__((always_inline)) void round(__m512i& a, __m512i& b, __m512i& c,
                                                                 __m512i& d, const __m512i* m) {
  __m512i f;
  if constexpr (I < 16)
    f = _mm512_ternarylogic_epi32(b, c, d, 0xca);
  else if constexpr (I < 32)
    f = _mm512_ternarylogic_epi32(d, b, c, 0xca);
  else if constexpr (I < 48)
    f = _mm512_ternarylogic_epi32(b, c, d, 0x96);
  else
    f = _mm512_ternarylogic_epi32(b, c, d, 0x39);
  f = _mm512_add_epi32(_mm512_add_epi32(f, a),
                       _mm512_add_epi32(_mm512_set1_epi32(int(kK[I])), m[message_word(I)]));
  constexpr int kShift = kS[I];  // an immediate even at -O0, where gcc folds no array read
  __m512i next_b = _mm512_add_epi32(b, _mm512_rol_epi32(f, kShift));
  a = d;
  d = c;
  c = b;
  b = next_b;
}

template <int... I>
DETAUDIT_AVX512 inline __attribute__((always_inline)) void all_rounds(
    __m512i& a, __m512i& b, __m512i& c, __m512i& d, const __m512i* m,
    std::integer_sequence<int, I...>) {
  (round<I>(a, b, c, d, m), ...);
}

DETAUDIT_AVX512 void compress(uint32_t (*state)[Md5Lanes::kLanes], const __m512i* m) {
  __m512i a = _mm512_load_si512(state[0]), b = _mm512_load_si512(state[1]);
  __m512i c = _mm512_load_si512(state[2]), d = _mm512_load_si512(state[3]);
  const __m512i a0 = a, b0 = b, c0 = c, d0 = d;
  all_rounds(a, b, c, d, m, std::make_integer_sequence<int, 64>());
  _mm512_store_si512(state[0], _mm512_add_epi32(a, a0));
  _mm512_store_si512(state[1], _mm512_add_epi32(b, b0));
  _mm512_store_si512(state[2], _mm512_add_epi32(c, c0));
  _mm512_store_si512(state[3], _mm512_add_epi32(d, d0));
}

// Loads one 64-byte block of each lane and transposes it: m[w] holds word w of every lane.
// Loads and shuffles, not gathers: a gather costs a memory access per lane.
DETAUDIT_AVX512 void load_transposed(const uint8_t* const* lanes, size_t offset, __m512i* m) {
  __m512i r[16];
  for (int l = 0; l < 16; ++l) r[l] = _mm512_loadu_si512(lanes[l] + offset);
  // A 16x16 transpose of 32-bit words: interleave 32-bit, then 64-bit elements, then move
  // 128-bit chunks across registers twice.
  __m512i t[16];
  for (int l = 0; l < 16; l += 2) {
    t[l] = _mm512_unpacklo_epi32(r[l], r[l + 1]);
    t[l + 1] = _mm512_unpackhi_epi32(r[l], r[l + 1]);
  }
  for (int l = 0; l < 16; l += 4) {
    r[l] = _mm512_unpacklo_epi64(t[l], t[l + 2]);
    r[l + 1] = _mm512_unpackhi_epi64(t[l], t[l + 2]);
    r[l + 2] = _mm512_unpacklo_epi64(t[l + 1], t[l + 3]);
    r[l + 3] = _mm512_unpackhi_epi64(t[l + 1], t[l + 3]);
  }
  for (int g = 0; g < 16; g += 8) {
    for (int k = 0; k < 4; ++k) {
      const __m512i x = r[g + k], y = r[g + 4 + k];
      t[g + k] = _mm512_shuffle_i32x4(x, y, 0x88);      // chunks 0, 2 of x, then of y
      t[g + 4 + k] = _mm512_shuffle_i32x4(x, y, 0xdd);  // chunks 1, 3 of x, then of y
    }
  }
  for (int k = 0; k < 8; ++k) {
    const __m512i x = t[k], y = t[8 + k];
    r[k] = _mm512_shuffle_i32x4(x, y, 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(x, y, 0xdd);
  }
  for (int w = 0; w < 16; ++w) m[w] = r[w];  // word w of lanes 0..15, in lane order
}

DETAUDIT_AVX512 void update_avx512(uint32_t (*state)[Md5Lanes::kLanes], const uint8_t* const* lanes,
                                   size_t nbytes) {
  __m512i m[16];
  for (size_t off = 0; off < nbytes; off += Md5Lanes::kBlockBytes) {
    load_transposed(lanes, off, m);
    compress(state, m);
  }
}

DETAUDIT_AVX512 void pad_avx512(uint32_t (*state)[Md5Lanes::kLanes], uint64_t total_bytes) {
  // Every lane's message is a whole number of blocks: the padding is one block, the same for all.
  __m512i m[16];
  const uint64_t bits = total_bytes * 8;
  m[0] = _mm512_set1_epi32(0x80);
  for (int w = 1; w < 14; ++w) m[w] = _mm512_setzero_si512();
  m[14] = _mm512_set1_epi32(int(uint32_t(bits)));
  m[15] = _mm512_set1_epi32(int(uint32_t(bits >> 32)));
  compress(state, m);
}

// ---- AVX2: two groups of eight lanes, interleaved so that one group's chain fills the other's
// latency. Rotations are two shifts; the boolean functions are the usual and/xor forms.

#define DETAUDIT_AVX2 __attribute__((target("avx2")))
#define DETAUDIT_INLINE inline __attribute__((always_inline))

constexpr int kGroups = 2;
constexpr size_t kGroupLanes = 8;

template <int I>
DETAUDIT_AVX2 DETAUDIT_INLINE void round8(__m256i& a, __m256i& b, __m256i& c, __m256i& d,
                                          const __m256i* m) {
  __m256i f;
  if constexpr (I < 16)
    f = _mm256_xor_si256(d, _mm256_and_si256(b, _mm256_xor_si256(c, d)));  // b ? c : d
  else if constexpr (I < 32)
    f = _mm256_xor_si256(c, _mm256_and_si256(d, _mm256_xor_si256(b, c)));  // d ? b : c
  else if constexpr (I < 48)
    f = _mm256_xor_si256(_mm256_xor_si256(b, c), d);
  else
    f = _mm256_xor_si256(c, _mm256_or_si256(b, _mm256_xor_si256(d, _mm256_set1_epi32(-1))));
  f = _mm256_add_epi32(_mm256_add_epi32(f, a),
                       _mm256_add_epi32(_mm256_set1_epi32(int(kK[I])), m[message_word(I)]));
  constexpr int kShift = kS[I];
  f = _mm256_or_si256(_mm256_slli_epi32(f, kShift), _mm256_srli_epi32(f, 32 - kShift));
  const __m256i next_b = _mm256_add_epi32(b, f);
  a = d;
  d = c;
  c = b;
  b = next_b;
}

struct Group {
  __m256i a, b, c, d;
};

template <int G, int... I>
DETAUDIT_AVX2 DETAUDIT_INLINE void all_rounds8(Group* g, const __m256i (*m)[16],
                                               std::integer_sequence<int, I...>) {
  if constexpr (G == 2)
    ((round8<I>(g[0].a, g[0].b, g[0].c, g[0].d, m[0]),
      round8<I>(g[1].a, g[1].b, g[1].c, g[1].d, m[1])),
     ...);
  else
    (round8<I>(g[0].a, g[0].b, g[0].c, g[0].d, m[0]), ...);
}

template <int G>
DETAUDIT_AVX2 void compress8(uint32_t (*state)[Md5Lanes::kLanes], const __m256i (*m)[16]) {
  Group g[G], g0[G];
  for (int k = 0; k < G; ++k) {
    g[k] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(state[0] + kGroupLanes * k)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(state[1] + kGroupLanes * k)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(state[2] + kGroupLanes * k)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(state[3] + kGroupLanes * k))};
    g0[k] = g[k];
  }
  all_rounds8<G>(g, m, std::make_integer_sequence<int, 64>());
  for (int k = 0; k < G; ++k) {
    const __m256i out[4] = {_mm256_add_epi32(g[k].a, g0[k].a), _mm256_add_epi32(g[k].b, g0[k].b),
                            _mm256_add_epi32(g[k].c, g0[k].c), _mm256_add_epi32(g[k].d, g0[k].d)};
    for (int w = 0; w < 4; ++w)
      _mm256_store_si256(reinterpret_cast<__m256i*>(state[w] + kGroupLanes * k), out[w]);
  }
}

template <int G>
DETAUDIT_AVX2 void update_avx2(uint32_t (*state)[Md5Lanes::kLanes], const uint8_t* const* lanes,
                               size_t nbytes) {
  __m256i m[G][16];
  for (size_t off = 0; off < nbytes; off += Md5Lanes::kBlockBytes) {
    for (int k = 0; k < G; ++k) {
      const uint8_t* const* group = lanes + kGroupLanes * k;
      for (int half = 0; half < 2; ++half) {
        __m256i* r = m[k] + 8 * half;
        for (size_t l = 0; l < kGroupLanes; ++l)
          r[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group[l] + off + 32 * half));
        transpose8x8_epi32(r);  // r[w]: word w of the group's 8 lanes
      }
    }
    compress8<G>(state, m);
  }
}

template <int G>
DETAUDIT_AVX2 void pad_avx2(uint32_t (*state)[Md5Lanes::kLanes], uint64_t total_bytes) {
  __m256i m[G][16];
  const uint64_t bits = total_bytes * 8;
  for (int k = 0; k < G; ++k) {
    m[k][0] = _mm256_set1_epi32(0x80);
    for (int w = 1; w < 14; ++w) m[k][w] = _mm256_setzero_si256();
    m[k][14] = _mm256_set1_epi32(int(uint32_t(bits)));
    m[k][15] = _mm256_set1_epi32(int(uint32_t(bits >> 32)));
  }
  compress8<G>(state, m);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

}  // namespace

bool Md5Lanes::available() {
  static const bool yes = has_avx512() || __builtin_cpu_supports("avx2");
  return yes;
}

void Md5Lanes::update(const uint8_t* const lanes[kLanes], size_t nbytes) {
  if (has_avx512())
    update_avx512(state_, lanes, nbytes);
  else if (used_ <= kGroupLanes)
    update_avx2<1>(state_, lanes, nbytes);
  else
    update_avx2<kGroups>(state_, lanes, nbytes);
}

void Md5Lanes::finish(uint64_t total_bytes, uint8_t digests[kLanes][16]) {
  if (has_avx512())
    pad_avx512(state_, total_bytes);
  else if (used_ <= kGroupLanes)
    pad_avx2<1>(state_, total_bytes);
  else
    pad_avx2<kGroups>(state_, total_bytes);
  for (size_t l = 0; l < kLanes; ++l) lane_digest(l, digests[l]);
}

#else

bool Md5Lanes::available() { return false; }
void Md5Lanes::update(const uint8_t* const[kLanes], size_t) {}
void Md5Lanes::finish(uint64_t, uint8_t[kLanes][16]) {}

#endif

}  // namespace detaudit
