// The device digest and its statistics, written once for the GPU kernel (hooks/device/) and the
// CPU reference (device_digest.cpp). Every function here is __host__ __device__ under nvcc and
// plain inline C++ elsewhere; the spec is docs/trace-format.md, "The device digest".
//
// A tensor's bytes, in logical order, are cut into 8-byte little-endian words (the last one padded
// with zeros) and into leaves of kLeafWords words. Word k of leaf i goes to lane k % kLanes of that
// leaf: a warp reads a leaf in coalesced rows of kLanes words. Each lane runs XXH64's round over its
// words, from a seed that depends on the lane's position in the tensor; the lanes fold pairwise
// into the leaf's hash; the leaves' hashes add up (mod 2^64) into the root. Integer addition is
// associative, so the root does not depend on how the leaves are scheduled, and the seeds make it
// depend on their order. An element's statistics go to the lane of its word, in index order, and
// fold in the same fixed trees: no floating-point atomics, the same bits on every GPU and host.
#pragma once

#include <cstdint>

#include "trace/dtype.h"

#if defined(__CUDACC__)
#define DETAUDIT_HD __host__ __device__ __forceinline__
#else
#define DETAUDIT_HD inline
#endif

namespace detaudit::lanes {

inline constexpr uint32_t kLanes = 32;
inline constexpr uint32_t kLeafWords = 512;  // 4 KiB: docs/trace-format.md says why
inline constexpr uint32_t kLeafBytes = kLeafWords * 8;
inline constexpr uint32_t kWordsPerLane = kLeafWords / kLanes;
static_assert(kLeafWords % kLanes == 0, "a leaf is whole rows of lanes");

// XXH64's primes, round and avalanche (github.com/Cyan4973/xxHash, doc/xxhash_spec.md).
inline constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

DETAUDIT_HD uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
DETAUDIT_HD uint64_t xxh64_round(uint64_t acc, uint64_t input) {
  return rotl64(acc + input * kP2, 31) * kP1;
}
DETAUDIT_HD uint64_t xxh64_avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

// Lane `lane` of leaf `leaf` starts here: a lane's hash depends on where its words are.
DETAUDIT_HD uint64_t lane_seed(uint64_t leaf, uint32_t lane) {
  return (leaf * kLanes + lane + 1) * kP1;
}
// Two neighbouring partial hashes, left then right; not symmetric, so order counts.
DETAUDIT_HD uint64_t fold_hash(uint64_t left, uint64_t right) { return xxh64_round(left, right); }
// The folded lanes of a leaf of `words` words.
DETAUDIT_HD uint64_t leaf_hash(uint64_t folded, uint32_t words) {
  return xxh64_avalanche(folded + uint64_t(words) * kP5);
}
// The sum of the leaves' hashes, of a tensor of `bytes` bytes.
DETAUDIT_HD uint64_t root_hash(uint64_t leaf_sum, uint64_t bytes) {
  return xxh64_avalanche(leaf_sum + bytes * kP4 + kP5);
}

// ---- Statistics ---------------------------------------------------------------------------------

// What the statistics read an element as, by the trace's dtype.
enum class ElementKind : uint8_t { kNone, kUnsigned, kSigned, kHalf, kBFloat16, kFloat, kDouble };

struct ElementType {
  ElementKind kind;
  uint8_t size;  // bytes; divides 8, so no element straddles two words
};

DETAUDIT_HD ElementType element_type(trace::Dtype dtype) {
  using trace::Dtype;
  switch (dtype) {
    case Dtype::kUInt8: return {ElementKind::kUnsigned, 1};
    case Dtype::kBool: return {ElementKind::kUnsigned, 1};
    case Dtype::kInt8: return {ElementKind::kSigned, 1};
    case Dtype::kInt16: return {ElementKind::kSigned, 2};
    case Dtype::kInt32: return {ElementKind::kSigned, 4};
    case Dtype::kInt64: return {ElementKind::kSigned, 8};
    case Dtype::kFloat16: return {ElementKind::kHalf, 2};
    case Dtype::kFloat32: return {ElementKind::kFloat, 4};
    case Dtype::kFloat64: return {ElementKind::kDouble, 8};
    case Dtype::kComplex64: return {ElementKind::kFloat, 4};    // over its components
    case Dtype::kComplex128: return {ElementKind::kDouble, 8};  // over its components
    case Dtype::kBFloat16: return {ElementKind::kBFloat16, 2};
    default: return {ElementKind::kNone, 1};
  }
}
DETAUDIT_HD bool is_floating(ElementKind k) {
  return k == ElementKind::kHalf || k == ElementKind::kBFloat16 || k == ElementKind::kFloat ||
         k == ElementKind::kDouble;
}

DETAUDIT_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}
DETAUDIT_HD double bits_to_double(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)bits);
#else
  double d;
  __builtin_memcpy(&d, &bits, 8);
  return d;
#endif
}
DETAUDIT_HD float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    exp = 127 - 15 + 1;  // subnormal: normalise
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    return bits_to_float(sign | (exp << 23) | ((mant & 0x3ff) << 13));
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}
DETAUDIT_HD float bf16_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

// Element `j` of a word (little-endian), as a double: exact for every kind.
DETAUDIT_HD double element_of_word(uint64_t word, ElementType t, uint32_t j) {
  const uint64_t raw = word >> (8 * t.size * j);
  switch (t.kind) {
    case ElementKind::kUnsigned: return double(uint8_t(raw));
    case ElementKind::kSigned:
      switch (t.size) {
        case 1: return double(int8_t(raw));
        case 2: return double(int16_t(raw));
        case 4: return double(int32_t(raw));
        default: return double(int64_t(raw));
      }
    case ElementKind::kHalf: return double(half_to_float(uint16_t(raw)));
    case ElementKind::kBFloat16: return double(bf16_to_float(uint16_t(raw)));
    case ElementKind::kFloat: return double(bits_to_float(uint32_t(raw)));
    case ElementKind::kDouble: return bits_to_double(raw);
    default: return 0.0;
  }
}

// Double arithmetic rounded step by step: nvcc would otherwise fuse x * x + q into one FMA, which
// rounds once and differs from the host (the host side is built with -ffp-contract=off).
DETAUDIT_HD double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DETAUDIT_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Partial statistics of a run of elements. NaNs are counted and left out of the rest; an Inf is
// counted and summed. min and max of no element are +Inf and -Inf.
struct LaneStats {
  double sum, sumsq, min, max;
  uint64_t count, nan, inf;
};

DETAUDIT_HD LaneStats empty_stats() {
  const double inf = bits_to_double(0x7ff0000000000000ULL);
  return LaneStats{0.0, 0.0, inf, -inf, 0, 0, 0};
}

DETAUDIT_HD void add_element(LaneStats* s, double x, bool floating) {
  if (x != x) {
    ++s->nan;
    return;
  }
  if (x - x != 0) ++s->inf;  // Inf - Inf is NaN; finite - itself is 0
  ++s->count;
  s->min = x < s->min ? x : s->min;
  s->max = x > s->max ? x : s->max;
  s->sum = add_rn(s->sum, x);
  if (floating) s->sumsq = add_rn(s->sumsq, mul_rn(x, x));
}

// The elements of one word (its first `elements` of 8 / size) into a lane's statistics.
DETAUDIT_HD void add_word(LaneStats* s, uint64_t word, ElementType t, uint32_t elements) {
  const bool floating = is_floating(t.kind);
  for (uint32_t j = 0; j < elements; ++j) add_element(s, element_of_word(word, t, j), floating);
}

// `left` then `right`, neighbours in the fixed trees.
DETAUDIT_HD void fold_stats(LaneStats* left, const LaneStats& right) {
  left->sum = add_rn(left->sum, right.sum);
  left->sumsq = add_rn(left->sumsq, right.sumsq);
  left->min = right.min < left->min ? right.min : left->min;
  left->max = right.max > left->max ? right.max : left->max;
  left->count += right.count;
  left->nan += right.nan;
  left->inf += right.inf;
}

// What the kernel hands back for one tensor: 56 bytes, read by the host in this layout.
struct LaneResult {
  uint64_t root;
  LaneStats stats;
};

}  // namespace detaudit::lanes
