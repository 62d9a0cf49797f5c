// Statistics in a fixed summation order, with SIMD paths that give the same bits (stats.h).
#include "digest/stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstring>
#include <limits>

#include "digest/lane_digest.h"

namespace detaudit {

using lanes::bf16_to_float;
using lanes::half_to_float;

StatsAccumulator::StatsAccumulator(trace::Dtype dtype)
    : kind_(lanes::element_type(dtype).kind),
      elem_size_(lanes::element_type(dtype).size),
      min_(std::numeric_limits<double>::infinity()),
      max_(-std::numeric_limits<double>::infinity()),
      imin_(std::numeric_limits<int64_t>::max()),
      imax_(std::numeric_limits<int64_t>::min()) {}

// ---- Statistics in a fixed summation order ----------------------------------------------------
//
// Two hosts must give the same statistics, bit for bit, for the same bytes: the tolerance gate
// compares runs recorded on different machines, in double. So every floating-point addition
// happens in an order that depends on the elements' indices only, never on the SIMD width, the
// CPU's features or the thread split (docs/trace-format.md, "Statistics"):
//
//  1. A tensor is cut into blocks of kStatsBlockBytes at fixed offsets (the last one shorter).
//     StatsAccumulator::update() cuts its input the same way; TensorDigester feeds it whole
//     blocks, whatever the split of the bytes it is given.
//  2. Within a block, element j goes to lane j % kStatsLanes (16). Each lane keeps a double sum
//     s and a double sum of squares q, adding its elements in index order: s += x; q += x * x,
//     x widened to double first. For float32, float16 and bfloat16 x * x is exact in double, so
//     a fused multiply-add gives the same bits; for float64 the product is rounded, then added
//     (DETAUDIT_NO_CONTRACT). A NaN is left out (adding +0.0 instead is the same: a lane's sum
//     starts at +0.0 and so is never -0.0). An Inf is summed.
//  3. At the end of the block the lanes fold pairwise: v[l] += v[l + w] for l < w, w = 8, 4, 2,
//     1. Block sums add into the leaf's sum in block order, leaves' sums into the tensor's in
//     leaf order, from +0.0.
//  4. min and max do not depend on the order; a zero min or max is reported as +0.0, since
//     vector and scalar min disagree on which zero of -0.0 and +0.0 is smaller.
// Every path below (StatsPath) computes exactly these lanes; tests/unit/trace_test.cpp checks
// each against plain scalar code that follows this order. Integer sums are plain sequential
// doubles (no compiler reorders them without -ffast-math, which this file refuses).
#if defined(__FAST_MATH__)
#error "stats.cpp must not be built with -ffast-math: statistics must not depend on the host"
#endif
#if defined(__clang__)
#define DETAUDIT_NO_CONTRACT
#define DETAUDIT_NO_CONTRACT_SCOPE _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define DETAUDIT_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#define DETAUDIT_NO_CONTRACT_SCOPE
#else
#define DETAUDIT_NO_CONTRACT
#define DETAUDIT_NO_CONTRACT_SCOPE
#endif

namespace {

constexpr size_t kLanes = kStatsLanes;
constexpr size_t kFastChunk = 1024;  // floats per try of a fast path; a multiple of kLanes

std::atomic<int> forced_path{int(StatsPath::kAuto)};

// One block's running sums: lane l holds elements l, l + 16, l + 32, ... of the block.
struct LaneSums {
  double s[kLanes] = {}, q[kLanes] = {};
};

// Folds the lanes pairwise (step 3 above) and returns the block's sum.
double fold_lanes(double* v) {
  for (size_t w = kLanes / 2; w >= 1; w /= 2)
    for (size_t l = 0; l < w; ++l) v[l] += v[l + w];
  return v[0];
}

struct FloatBlock {
  LaneSums lanes;
  float mn = std::numeric_limits<float>::infinity();
  float mx = -std::numeric_limits<float>::infinity();
  uint64_t count = 0, nan = 0, inf = 0;
};

// The careful path, and the only one off x86: any n, NaN and Inf tested on the bits, written
// so that the compiler vectorises it across lanes (which keeps each lane's order). x's first
// element goes to lane 0: callers cut a block at multiples of kLanes.
inline __attribute__((always_inline)) void f32_lanes_careful(const float* x, size_t n,
                                                             FloatBlock* b) {
  LaneSums ls = b->lanes;  // a local copy: the compiler then knows nothing else writes it
  float mn[kLanes], mx[kLanes];
  uint32_t nan[kLanes] = {}, inf[kLanes] = {};
  for (size_t l = 0; l < kLanes; ++l) {
    mn[l] = b->mn;
    mx[l] = b->mx;
  }
  auto step = [&](size_t l, const float* p) __attribute__((always_inline)) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    const uint32_t mag = bits & 0x7fffffffu;
    const uint32_t is_nan = mag > 0x7f800000u;
    const uint32_t kept = bits & (is_nan - 1);  // a NaN becomes +0.0: the same as leaving it out
    float v, z;
    std::memcpy(&v, p, 4);
    std::memcpy(&z, &kept, 4);
    const double d = z;
    ls.s[l] += d;
    ls.q[l] += d * d;  // exact: a fused multiply-add changes nothing
    nan[l] += is_nan;
    inf[l] += mag == 0x7f800000u;
    mn[l] = v < mn[l] ? v : mn[l];  // a NaN compares false: left out
    mx[l] = v > mx[l] ? v : mx[l];
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) step(l, x + i + l);
  for (size_t l = 0; i + l < n; ++l) step(l, x + i + l);
  b->lanes = ls;
  uint64_t nans = 0;
  for (size_t l = 0; l < kLanes; ++l) {
    b->mn = std::min(b->mn, mn[l]);
    b->mx = std::max(b->mx, mx[l]);
    nans += nan[l];
    b->inf += inf[l];
  }
  b->nan += nans;
  b->count += n - nans;
}

void f32_lanes_portable(const float* x, size_t n, FloatBlock* b) { f32_lanes_careful(x, n, b); }

#if defined(__x86_64__)
// The same code vectorised for AVX2: the careful path of the fast ones below.
__attribute__((target("avx2,fma"))) void f32_lanes_careful_avx2(const float* x, size_t n,
                                                                FloatBlock* b) {
  f32_lanes_careful(x, n, b);
}

// The fast paths, for finite floats (n a multiple of kLanes): the same lanes, no per-element
// tests. They go chunk by chunk (kFastChunk floats); a NaN or an Inf in a chunk makes a lane's
// sum non-finite (sums and squares of finite floats cannot overflow a double), and they stop
// before that chunk, its sums undone, and return how many floats they took. The careful path
// takes that chunk. A lane already non-finite (an earlier Inf) stops them at every chunk: its
// sum would hide another Inf. min and max may have seen part of the chunk that stopped them: no
// matter, the careful path sees the same values. min and max take two rows at a time, which
// finite values allow.
__attribute__((target("avx2,fma"))) size_t f32_lanes_avx2(const float* x, size_t n, FloatBlock* b) {
  double* s = b->lanes.s;
  double* q = b->lanes.q;
  __m256d s0 = _mm256_loadu_pd(s), s1 = _mm256_loadu_pd(s + 4), s2 = _mm256_loadu_pd(s + 8),
          s3 = _mm256_loadu_pd(s + 12);  // lanes 0-3, 4-7, 8-11, 12-15
  __m256d q0 = _mm256_loadu_pd(q), q1 = _mm256_loadu_pd(q + 4), q2 = _mm256_loadu_pd(q + 8),
          q3 = _mm256_loadu_pd(q + 12);
  __m256 mn = _mm256_set1_ps(b->mn), mx = _mm256_set1_ps(b->mx);
  size_t done = 0;
  while (done < n) {
    const __m256d k0 = s0, k1 = s1, k2 = s2, k3 = s3, r0 = q0, r1 = q1, r2 = q2, r3 = q3;
    const size_t end = done + std::min(kFastChunk, n - done);
    for (size_t i = done; i < end; i += kLanes) {
      const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
      mn = _mm256_min_ps(_mm256_min_ps(v0, v1), mn);
      mx = _mm256_max_ps(_mm256_max_ps(v0, v1), mx);
      const __m256d d0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
      const __m256d d1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
      const __m256d d2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));
      const __m256d d3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
      s0 = _mm256_add_pd(s0, d0);
      s1 = _mm256_add_pd(s1, d1);
      s2 = _mm256_add_pd(s2, d2);
      s3 = _mm256_add_pd(s3, d3);
      q0 = _mm256_fmadd_pd(d0, d0, q0);
      q1 = _mm256_fmadd_pd(d1, d1, q1);
      q2 = _mm256_fmadd_pd(d2, d2, q2);
      q3 = _mm256_fmadd_pd(d3, d3, q3);
    }
    // x * 0 is 0 for finite x, NaN for NaN and Inf. (A sum that overflows only sends a finite
    // chunk to the careful path, which gives the same bits.)
    const __m256d zero = _mm256_setzero_pd();
    const __m256d t = _mm256_mul_pd(
        _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)),
                      _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3))),
        zero);
    if (_mm256_movemask_pd(_mm256_cmp_pd(t, t, _CMP_ORD_Q)) != 0xf) {
      s0 = k0, s1 = k1, s2 = k2, s3 = k3, q0 = r0, q1 = r1, q2 = r2, q3 = r3;
      break;
    }
    done = end;
  }
  _mm256_storeu_pd(s, s0);
  _mm256_storeu_pd(s + 4, s1);
  _mm256_storeu_pd(s + 8, s2);
  _mm256_storeu_pd(s + 12, s3);
  _mm256_storeu_pd(q, q0);
  _mm256_storeu_pd(q + 4, q1);
  _mm256_storeu_pd(q + 8, q2);
  _mm256_storeu_pd(q + 12, q3);
  alignas(32) float mnf[8], mxf[8];
  _mm256_store_ps(mnf, mn);
  _mm256_store_ps(mxf, mx);
  for (int l = 0; l < 8; ++l) {
    b->mn = std::min(b->mn, mnf[l]);
    b->mx = std::max(b->mx, mxf[l]);
  }
  b->count += done;
  return done;
}

// (GCC 12 warns falsely inside avx512fintrin.h, on _mm512_undefined operands.)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512dq"))) size_t f32_lanes_avx512(const float* x, size_t n,
                                                                    FloatBlock* b) {
  double* s = b->lanes.s;
  double* q = b->lanes.q;
  __m512d s0 = _mm512_loadu_pd(s), s1 = _mm512_loadu_pd(s + 8);  // lanes 0-7, 8-15
  __m512d q0 = _mm512_loadu_pd(q), q1 = _mm512_loadu_pd(q + 8);
  __m512 mn = _mm512_set1_ps(b->mn), mx = _mm512_set1_ps(b->mx);
#define DETAUDIT_ROW(v)                                               \
  do {                                                                \
    const __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));    \
    const __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); \
    s0 = _mm512_add_pd(s0, d0);                                       \
    s1 = _mm512_add_pd(s1, d1);                                       \
    q0 = _mm512_fmadd_pd(d0, d0, q0);                                 \
    q1 = _mm512_fmadd_pd(d1, d1, q1);                                 \
  } while (0)
  size_t done = 0;
  while (done < n) {
    const __m512d k0 = s0, k1 = s1, r0 = q0, r1 = q1;
    const size_t end = done + std::min(kFastChunk, n - done);
    size_t i = done;
    for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
      const __m512 v = _mm512_loadu_ps(x + i), w = _mm512_loadu_ps(x + i + kLanes);
      mn = _mm512_min_ps(_mm512_min_ps(v, w), mn);
      mx = _mm512_max_ps(_mm512_max_ps(v, w), mx);
      DETAUDIT_ROW(v);
      DETAUDIT_ROW(w);
    }
    if (i < end) {
      const __m512 v = _mm512_loadu_ps(x + i);
      mn = _mm512_min_ps(v, mn);
      mx = _mm512_max_ps(v, mx);
      DETAUDIT_ROW(v);
    }
    const __m512d t = _mm512_mul_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(q0, q1)),
                                    _mm512_setzero_pd());  // as in the AVX2 path
    if (_mm512_cmp_pd_mask(t, t, _CMP_ORD_Q) != 0xff) {
      s0 = k0, s1 = k1, q0 = r0, q1 = r1;
      break;
    }
    done = end;
  }
#undef DETAUDIT_ROW
  _mm512_storeu_pd(s, s0);
  _mm512_storeu_pd(s + 8, s1);
  _mm512_storeu_pd(q, q0);
  _mm512_storeu_pd(q + 8, q1);
  b->mn = std::min(b->mn, _mm512_reduce_min_ps(mn));
  b->mx = std::max(b->mx, _mm512_reduce_max_ps(mx));
  b->count += done;
  return done;
}
#pragma GCC diagnostic pop
#endif

struct Paths {
  size_t (*fast)(const float*, size_t, FloatBlock*);  // null: the careful path only
  void (*careful)(const float*, size_t, FloatBlock*);
};

Paths paths(StatsPath p) {
#if defined(__x86_64__)
  if (p == StatsPath::kAvx512) return {f32_lanes_avx512, f32_lanes_careful_avx2};
  if (p == StatsPath::kAvx2) return {f32_lanes_avx2, f32_lanes_careful_avx2};
#endif
  return {nullptr, f32_lanes_portable};
}

StatsPath best_path() {
  static const StatsPath best = [] {
    for (StatsPath p : {StatsPath::kAvx512, StatsPath::kAvx2})
      if (stats_path_available(p)) return p;
    return StatsPath::kPortable;
  }();
  return best;
}

// A run of a block's floats whose first element is in lane 0.
void f32_block(const float* x, size_t n, FloatBlock* b) {
  const int forced = forced_path.load(std::memory_order_relaxed);
  const Paths p = paths(forced == int(StatsPath::kAuto) ? best_path() : StatsPath(forced));
  size_t i = 0;
  if (p.fast) {
    // Small tensors too: a 4x32 activation is 8 rows of the lanes.
    const size_t whole = n / kLanes * kLanes;
    while (i < whole) {
      i += p.fast(x + i, whole - i, b);
      if (i == whole) break;
      const size_t m = std::min(kFastChunk, whole - i);  // the chunk that stopped it
      p.careful(x + i, m, b);
      i += m;
    }
  }
  if (i < n) p.careful(x + i, n - i, b);
}

// Half and bfloat16 widen into a small float buffer, then take the float32 path; the buffer's
// length is a multiple of kLanes, so every element keeps its lane.
template <typename Widen>
void widened_block(const uint8_t* p, size_t n, Widen widen, FloatBlock* b) {
  constexpr size_t kBuf = 512;
  static_assert(kBuf % kLanes == 0, "a buffer starts in lane 0");
  float buf[kBuf];
  for (size_t i = 0; i < n; i += kBuf) {
    const size_t m = std::min(kBuf, n - i);
    for (size_t j = 0; j < m; ++j) {
      uint16_t h;
      std::memcpy(&h, p + 2 * (i + j), 2);
      buf[j] = widen(h);
    }
    f32_block(buf, m, b);
  }
}

struct DoubleBlock {
  LaneSums lanes;
  double mn = std::numeric_limits<double>::infinity();
  double mx = -std::numeric_limits<double>::infinity();
  uint64_t count = 0, nan = 0, inf = 0;
};

// float64: the same lanes. x * x is rounded to double, then added: never a fused
// multiply-add, which would round once and differ on hosts (or builds) that have FMA.
DETAUDIT_NO_CONTRACT void f64_lanes(const uint8_t* p, size_t n, DoubleBlock* b) {
  DETAUDIT_NO_CONTRACT_SCOPE
  LaneSums& ls = b->lanes;
  uint64_t nans = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t l = i % kLanes;
    double x;
    std::memcpy(&x, p + i * 8, 8);
    if (x != x) {
      ++nans;
      continue;
    }
    b->inf += std::isinf(x);
    b->mn = std::min(b->mn, x);
    b->mx = std::max(b->mx, x);
    ls.s[l] += x;
    const double sq = x * x;
    ls.q[l] += sq;
  }
  b->nan += nans;
  b->count += n - nans;
}

}  // namespace

bool stats_path_available(StatsPath p) {
  switch (p) {
    case StatsPath::kAuto:
    case StatsPath::kPortable: return true;
#if defined(__x86_64__)
    case StatsPath::kAvx2: {
      static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
      return yes;
    }
    case StatsPath::kAvx512: {
      static const bool yes = __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512dq");
      return yes;
    }
#endif
    default: return false;
  }
}

void force_stats_path(StatsPath p) {
  forced_path.store(int(stats_path_available(p) ? p : StatsPath::kAuto));
}

void StatsAccumulator::update(const void* data, size_t nbytes) {
  if (kind_ == Kind::kNone) return;
  const auto* p = static_cast<const uint8_t*>(data);
  nbytes -= nbytes % elem_size_;
  for (size_t off = 0; off < nbytes; off += kStatsBlockBytes)
    update_block(p + off, std::min(kStatsBlockBytes, nbytes - off) / elem_size_);
}

void StatsAccumulator::update_block(const uint8_t* p, size_t n) {
  switch (kind_) {
    case Kind::kFloat:
    case Kind::kHalf:
    case Kind::kBFloat16: {
      FloatBlock b;
      if (kind_ == Kind::kFloat)
        f32_block(reinterpret_cast<const float*>(p), n, &b);  // tensor data is float-aligned
      else if (kind_ == Kind::kHalf)
        widened_block(p, n, half_to_float, &b);
      else
        widened_block(p, n, bf16_to_float, &b);
      if (b.count) {
        min_ = std::min(min_, double(b.mn));
        max_ = std::max(max_, double(b.mx));
      }
      sum_ += fold_lanes(b.lanes.s);
      sumsq_ += fold_lanes(b.lanes.q);
      count_ += b.count;
      nan_ += b.nan;
      inf_ += b.inf;
      break;
    }
    case Kind::kDouble: {
      DoubleBlock b;
      f64_lanes(p, n, &b);
      min_ = std::min(min_, b.mn);
      max_ = std::max(max_, b.mx);
      sum_ += fold_lanes(b.lanes.s);
      sumsq_ += fold_lanes(b.lanes.q);
      count_ += b.count;
      nan_ += b.nan;
      inf_ += b.inf;
      break;
    }
    case Kind::kSigned:
    case Kind::kUnsigned:
      // In index order: no vector code reorders a sum of doubles without -ffast-math.
      for (size_t i = 0; i < n; ++i) {
        int64_t v = 0;
        const uint8_t* q = p + i * elem_size_;
        if (kind_ == Kind::kUnsigned) {
          v = *q;
        } else if (elem_size_ == 1) {
          v = int8_t(*q);
        } else if (elem_size_ == 2) {
          int16_t x;
          std::memcpy(&x, q, 2);
          v = x;
        } else if (elem_size_ == 4) {
          int32_t x;
          std::memcpy(&x, q, 4);
          v = x;
        } else {
          std::memcpy(&v, q, 8);
        }
        imin_ = std::min(imin_, v);
        imax_ = std::max(imax_, v);
        sum_ += double(v);
      }
      count_ += n;
      break;
    case Kind::kNone: break;
  }
}

trace::TensorStats summarize_stats(double min, double max, double sum, double sumsq, uint64_t count,
                                   uint64_t nan, uint64_t inf, bool integral) {
  trace::TensorStats s;
  s.nan = nan;
  s.inf = inf;
  if (count == 0) return s;
  s.min = min == 0 ? 0.0 : min;
  s.max = max == 0 ? 0.0 : max;
  if (!integral) s.l2 = std::sqrt(sumsq);
  s.mean = sum / double(count);
  return s;
}

void store_stats(const trace::TensorStats* stats, bool integral, trace::TensorDesc* out) {
  out->bits &= uint8_t(
      ~(trace::kTensorHasStats | trace::kTensorIntStats | trace::kTensorHasNanInf));
  if (!stats) return;
  out->stats = *stats;
  out->bits |= trace::kTensorHasStats;
  if (integral) out->bits |= trace::kTensorIntStats;
  if (stats->nan || stats->inf) out->bits |= trace::kTensorHasNanInf;
}

trace::TensorStats StatsAccumulator::finish() const {
  return integral()
             ? summarize_stats(double(imin_), double(imax_), sum_, 0, count_, nan_, inf_, true)
             : summarize_stats(min_, max_, sum_, sumsq_, count_, nan_, inf_, false);
}

void StatsAccumulator::merge(const StatsAccumulator& next) {
  min_ = std::min(min_, next.min_);
  max_ = std::max(max_, next.max_);
  imin_ = std::min(imin_, next.imin_);
  imax_ = std::max(imax_, next.imax_);
  sum_ += next.sum_;
  sumsq_ += next.sumsq_;
  count_ += next.count_;
  nan_ += next.nan_;
  inf_ += next.inf_;
}

}  // namespace detaudit
