// Tensor statistics are the same bits on every host (issue 13): the summation order is a fixed
// function of the element index (src/digest/digest.cpp), whatever the vector path, the split of
// the bytes and the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "digest/digest.h"

namespace detaudit {
namespace {

using trace::DigestAlgo;
using trace::TensorDesc;
using trace::TensorStats;

// ---- The documented order, in plain scalar code -------------------------------------------

constexpr size_t kLaneCount = 16;

double half_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(double(mant), -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(double(1024 + mant), exp - 25);
}

double bf16_value(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The elements of a tensor's bytes as doubles, in index order.
std::vector<double> values_of(uint8_t dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> v;
  if (dtype == 6 || dtype == 9) {
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float f;
      std::memcpy(&f, &bytes[i], 4);
      v.push_back(f);
    }
  } else if (dtype == 7) {
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      double d;
      std::memcpy(&d, &bytes[i], 8);
      v.push_back(d);
    }
  } else {
    for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &bytes[i], 2);
      v.push_back(dtype == 5 ? half_value(h) : bf16_value(h));
    }
  }
  return v;
}

size_t elem_size(uint8_t dtype) { return dtype == 7 ? 8 : (dtype == 6 || dtype == 9) ? 4 : 2; }

// docs/trace-format.md: 16 KiB blocks; element j of a block in lane j % 16, each lane summing
// in index order; lanes folded pairwise (8, 4, 2, 1); blocks in order within a 1 MiB leaf,
// leaves in order. `lanes` other than 16 gives the orders a different design would have.
TensorStats reference(uint8_t dtype, const std::vector<uint8_t>& bytes, size_t lanes = kLaneCount) {
  const std::vector<double> x = values_of(dtype, bytes);
  const size_t per_block = kStatsBlockBytes / elem_size(dtype);
  const size_t per_leaf = kLeafBytes / elem_size(dtype);
  TensorStats st;
  double mn = INFINITY, mx = -INFINITY, sum = 0, sumsq = 0;
  uint64_t count = 0;
  for (size_t leaf = 0; leaf < x.size(); leaf += per_leaf) {
    double leaf_s = 0, leaf_q = 0;
    const size_t leaf_end = std::min(x.size(), leaf + per_leaf);
    for (size_t block = leaf; block < leaf_end; block += per_block) {
      std::vector<double> s(lanes, 0.0), q(lanes, 0.0);
      for (size_t j = 0; block + j < std::min(leaf_end, block + per_block); ++j) {
        const double v = x[block + j];
        if (std::isnan(v)) {
          ++st.nan;
          continue;
        }
        st.inf += std::isinf(v);
        mn = std::min(mn, v);
        mx = std::max(mx, v);
        ++count;
        s[j % lanes] += v;
        volatile double p = v * v;  // rounded, never fused into the addition
        q[j % lanes] += p;
      }
      for (size_t w = lanes / 2; w >= 1; w /= 2)
        for (size_t l = 0; l < w; ++l) {
          s[l] += s[l + w];
          q[l] += q[l + w];
        }
      leaf_s += s[0];
      leaf_q += q[0];
    }
    sum += leaf_s;
    sumsq += leaf_q;
  }
  if (count) {
    st.min = mn == 0 ? 0.0 : mn;
    st.max = mx == 0 ? 0.0 : mx;
    st.mean = sum / double(count);
    st.l2 = std::sqrt(sumsq);
  }
  return st;
}

// Bit for bit; any NaN equals any NaN (inf - inf's sign is the CPU's, and the gate treats NaN
// as equal to NaN).
bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

::testing::AssertionResult same_stats(const TensorStats& got, const TensorStats& want) {
  const double g[] = {got.min, got.max, got.mean, got.l2};
  const double w[] = {want.min, want.max, want.mean, want.l2};
  const char* names[] = {"min", "max", "mean", "l2"};
  for (int k = 0; k < 4; ++k)
    if (!same_bits(g[k], w[k]))
      return ::testing::AssertionFailure()
             << names[k] << ": got " << std::hexfloat << g[k] << ", want " << w[k];
  if (got.nan != want.nan || got.inf != want.inf)
    return ::testing::AssertionFailure() << "nan/inf: got " << got.nan << "/" << got.inf
                                         << ", want " << want.nan << "/" << want.inf;
  return ::testing::AssertionSuccess();
}

// Every statistics path this CPU can run, the portable one first.
std::vector<StatsPath> paths() {
  std::vector<StatsPath> out;
  for (StatsPath p : {StatsPath::kPortable, StatsPath::kAvx2, StatsPath::kAvx512})
    if (stats_path_available(p)) out.push_back(p);
  return out;
}

const char* path_name(StatsPath p) {
  switch (p) {
    case StatsPath::kPortable: return "portable";
    case StatsPath::kAvx2: return "avx2";
    case StatsPath::kAvx512: return "avx512";
    default: return "auto";
  }
}

struct ForcePath {
  explicit ForcePath(StatsPath p) { force_stats_path(p); }
  ~ForcePath() { force_stats_path(StatsPath::kAuto); }
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Float32 values whose sum depends on its order: magnitudes from 2^-20 to 2^24, both signs.
std::vector<float> ill_conditioned(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(u(g), int(g() % 45) - 20);
  return v;
}

TensorStats accumulate(uint8_t dtype, const std::vector<uint8_t>& bytes) {
  StatsAccumulator a(dtype);
  a.update(bytes.data(), bytes.size());
  return a.finish();
}

TensorStats digest_stats(uint8_t dtype, const std::vector<uint8_t>& bytes,
                         const std::function<void(TensorDigester&)>& feed) {
  Hasher h(DigestAlgo::kXxh3);
  TensorDigester d(&h, dtype, true);
  feed(d);
  TensorDesc out;
  d.finish(&out);
  EXPECT_TRUE(out.has_stats());
  return out.stats;
}

// ---- The order is pinned ------------------------------------------------------------------

// Hand-made inputs whose sum depends on the order, with the exact means the documented order
// gives: what makes "independent of the SIMD width" checkable on one host.
TEST(StatsOrderTest, TheDocumentedOrderPinned) {
  const float big = std::ldexp(1.f, 60);  // 1 + 2^60 is 2^60 in double
  // Lanes: elements 0 and 16 share lane 0 and cancel before any 1 is added to them: 30 ones
  // survive. Summed in index order 15 survive; 8 lanes (AVX2's width in float) keep 29, 4 lanes
  // (SSE's) 27.
  std::vector<float> lanes(32, 1.f);
  lanes[0] = big;
  lanes[16] = -big;
  // The fold: lanes 0 and 8 meet first (w = 8) and cancel: 14 ones survive; folding lane by
  // lane in order keeps 7.
  std::vector<float> fold(16, 1.f);
  fold[0] = big;
  fold[8] = -big;
  const std::vector<uint8_t> lb = bytes_of(lanes), fb = bytes_of(fold);
  EXPECT_EQ(reference(6, lb).mean, 30.0 / 32);
  EXPECT_EQ(reference(6, lb, 8).mean, 29.0 / 32);
  EXPECT_EQ(reference(6, lb, 4).mean, 27.0 / 32);
  EXPECT_EQ(reference(6, fb).mean, 14.0 / 16);
  double sequential = 0;
  for (float x : lanes) sequential += x;
  EXPECT_EQ(sequential / 32, 15.0 / 32);
  for (StatsPath p : paths()) {
    ForcePath force(p);
    EXPECT_EQ(accumulate(6, lb).mean, 30.0 / 32) << path_name(p);
    EXPECT_EQ(accumulate(6, fb).mean, 14.0 / 16) << path_name(p);
    // The same through half precision's and float64's paths (2^60 is no half: 2^15 is).
    std::vector<double> d(lanes.begin(), lanes.end());
    EXPECT_EQ(accumulate(7, bytes_of(d)).mean, 30.0 / 32) << path_name(p);
  }
}

// Random values from 2^-20 to 2^24, both signs: every path gives the documented order's bits,
// and that order is not the sequential one's, nor 4, 8 or 32 lanes'.
TEST(StatsOrderTest, EveryPathSumsInTheDocumentedLaneOrder) {
  const std::vector<float> v = ill_conditioned(3 * 4096 + 77, 1);
  const std::vector<uint8_t> bytes = bytes_of(v);
  const TensorStats want = reference(6, bytes);

  double sequential = 0, sequential_sq = 0;
  for (float x : v) {
    sequential += x;
    sequential_sq += double(x) * x;
  }
  EXPECT_NE(sequential / double(v.size()), want.mean) << "the input does not pin the order";
  EXPECT_NE(std::sqrt(sequential_sq), want.l2) << "the input does not pin the order";
  for (size_t lanes : {4u, 8u, 32u}) {
    const TensorStats other = reference(6, bytes, lanes);
    EXPECT_NE(other.mean, want.mean) << lanes << " lanes";
  }
  float float_sum = 0;  // float32 accumulation, as before issue 13
  for (float x : v) float_sum += x;
  EXPECT_NE(double(float_sum) / double(v.size()), want.mean);

  for (StatsPath p : paths()) {
    ForcePath force(p);
    EXPECT_TRUE(same_stats(accumulate(6, bytes), want)) << path_name(p);
  }
}

// Lengths around the lanes and the blocks, NaN and Inf (the careful path, chunk by chunk, and
// the fast path after it), each dtype with float statistics.
TEST(StatsOrderTest, EveryPathEveryDtypeEveryLengthMatchesTheReference) {
  std::mt19937 g(7);
  for (size_t n : {0u, 1u, 15u, 16u, 17u, 33u, 1000u, 1024u, 1040u, 4096u, 4097u, 8192u, 8199u,
                   20000u}) {
    for (int special = 0; special < 5; ++special) {
      std::vector<float> v = ill_conditioned(n, uint32_t(n * 10 + special));
      if (n > 20) {
        if (special == 1) v[n / 2] = NAN;                        // one NaN mid-tensor
        if (special == 2) v[n - 3] = INFINITY;                   // an Inf near the end
        if (special == 3) v[5] = INFINITY, v[n - 1] = -INFINITY;  // Inf - Inf: the mean is NaN
        if (special == 4)
          for (size_t i = 0; i < n; i += 3) v[i] = NAN;          // mostly NaN
      }
      // float32 and complex64 (its components, in order).
      const std::vector<uint8_t> f32 = bytes_of(v);
      // float64: the same values, some beyond float's precision.
      std::vector<double> d(v.begin(), v.end());
      for (size_t i = 0; i < d.size(); i += 7) d[i] *= 1.0 + 1e-12 * double(i % 13);
      const std::vector<uint8_t> f64 = bytes_of(d);
      // float16 and bfloat16: random bits, subnormals, Inf and NaN included.
      std::vector<uint16_t> h(n);
      for (auto& x : h) x = uint16_t(g());
      const std::vector<uint8_t> f16 = bytes_of(h);
      for (StatsPath p : paths()) {
        ForcePath force(p);
        const std::string what =
            std::string(path_name(p)) + " n=" + std::to_string(n) + " case " + std::to_string(special);
        EXPECT_TRUE(same_stats(accumulate(6, f32), reference(6, f32))) << "float32 " << what;
        EXPECT_TRUE(same_stats(accumulate(9, f32), reference(9, f32))) << "complex64 " << what;
        EXPECT_TRUE(same_stats(accumulate(7, f64), reference(7, f64))) << "float64 " << what;
        EXPECT_TRUE(same_stats(accumulate(5, f16), reference(5, f16))) << "float16 " << what;
        EXPECT_TRUE(same_stats(accumulate(15, f16), reference(15, f16))) << "bfloat16 " << what;
      }
    }
  }
}

// -0.0 and +0.0: vector and scalar min keep different zeros; the statistics keep +0.0.
TEST(StatsOrderTest, ZeroMinAndMaxArePositiveZero) {
  std::vector<float> v(64, 0.f);
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -0.f;
  for (StatsPath p : paths()) {
    ForcePath force(p);
    const TensorStats st = accumulate(6, bytes_of(v));
    EXPECT_FALSE(std::signbit(st.min)) << path_name(p);
    EXPECT_FALSE(std::signbit(st.max)) << path_name(p);
    EXPECT_FALSE(std::signbit(st.mean)) << path_name(p);
  }
}

// ---- The order does not depend on how the bytes come ---------------------------------------

// Across leaves: the same bits fed whole, in uneven pieces, or through update_all on 1, 3 or 5
// threads, on every path, and the reference's.
TEST(StatsOrderTest, SameBitsWhateverTheSplitThreadsAndPath) {
  const ParallelFor serial = [](size_t n, const std::function<void(size_t, size_t)>& fn) {
    fn(0, n);
  };
  auto threads = [](size_t k) {
    return ParallelFor([k](size_t n, const std::function<void(size_t, size_t)>& fn) {
      std::vector<std::thread> pool;
      for (size_t t = 0; t < k; ++t) pool.emplace_back([&, t] { fn(n * t / k, n * (t + 1) / k); });
      for (auto& th : pool) th.join();
    });
  };
  // 2.3 leaves of float32, a NaN in the second; 1.6 leaves of float16; 1.2 of float64.
  std::vector<float> f = ill_conditioned(kLeafBytes / 4 * 23 / 10 + 5, 3);
  f[kLeafBytes / 4 + 999] = NAN;
  std::vector<uint16_t> h(kLeafBytes / 2 * 16 / 10 + 3);
  std::mt19937 g(5);
  for (auto& x : h) x = uint16_t(g() & 0x7bff);  // finite halves
  std::vector<double> d(kLeafBytes / 8 * 12 / 10 + 1);
  for (size_t i = 0; i < d.size(); ++i) d[i] = std::ldexp(double(f[i]), int(i % 9)) / 3.0;
  const std::pair<uint8_t, std::vector<uint8_t>> tensors[] = {
      {6, bytes_of(f)}, {5, bytes_of(h)}, {7, bytes_of(d)}};
  for (const auto& [dtype, bytes] : tensors) {
    const TensorStats want = reference(dtype, bytes);
    for (StatsPath p : paths()) {
      ForcePath force(p);
      const std::string what = std::string(path_name(p)) + " dtype " + std::to_string(dtype);
      EXPECT_TRUE(same_stats(digest_stats(dtype, bytes, [&](TensorDigester& t) {
        t.update(bytes.data(), bytes.size());
      }), want)) << what << " whole";
      for (size_t piece : {size_t(4099), size_t(333), kLeafBytes + 3}) {
        EXPECT_TRUE(same_stats(digest_stats(dtype, bytes, [&](TensorDigester& t) {
          for (size_t off = 0; off < bytes.size(); off += piece)
            t.update(bytes.data() + off, std::min(piece, bytes.size() - off));
        }), want)) << what << " pieces of " << piece;
      }
      for (size_t k : {1u, 3u, 5u}) {
        const ParallelFor pool = k == 1 ? serial : threads(k);
        EXPECT_TRUE(same_stats(digest_stats(dtype, bytes, [&](TensorDigester& t) {
          t.update_all(bytes.data(), bytes.size(), pool);
        }), want)) << what << " update_all on " << k << " threads";
      }
    }
  }
}

}  // namespace
}  // namespace detaudit
