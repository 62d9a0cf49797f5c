// Tensor statistics are the same bits on every host (issue 13): the summation order is a fixed
// function of the element index (src/digest/stats.cpp, docs/trace-format.md "Statistics"),
// whatever the vector path, the split of the bytes and the thread count; the trace stores the
// doubles and the tolerance gate compares them, not float32 roundings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "diff/diff.h"
#include "diff/report_model.h"
#include "digest/digest.h"
#include "trace/reader.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using trace::DigestAlgo;
using trace::Dtype;
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
std::vector<double> values_of(Dtype dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> v;
  if (dtype == Dtype::kFloat32 || dtype == Dtype::kComplex64) {
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float f;
      std::memcpy(&f, &bytes[i], 4);
      v.push_back(f);
    }
  } else if (dtype == Dtype::kFloat64) {
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      double d;
      std::memcpy(&d, &bytes[i], 8);
      v.push_back(d);
    }
  } else {
    for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &bytes[i], 2);
      v.push_back(dtype == Dtype::kFloat16 ? half_value(h) : bf16_value(h));
    }
  }
  return v;
}

size_t elem_size(Dtype dtype) {
  return dtype == Dtype::kFloat64                                   ? 8
         : (dtype == Dtype::kFloat32 || dtype == Dtype::kComplex64) ? 4
                                                                    : 2;
}

// docs/trace-format.md: 16 KiB blocks; element j of a block in lane j % 16, each lane summing
// in index order; lanes folded pairwise (8, 4, 2, 1); blocks in order within a 1 MiB leaf,
// leaves in order. `lanes` other than 16 gives the orders a different design would have.
TensorStats reference(Dtype dtype, const std::vector<uint8_t>& bytes, size_t lanes = kLaneCount) {
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

TensorStats accumulate(Dtype dtype, const std::vector<uint8_t>& bytes) {
  StatsAccumulator a(dtype);
  a.update(bytes.data(), bytes.size());
  return a.finish();
}

TensorStats digest_stats(Dtype dtype, const std::vector<uint8_t>& bytes,
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
  EXPECT_EQ(reference(Dtype::kFloat32, lb).mean, 30.0 / 32);
  EXPECT_EQ(reference(Dtype::kFloat32, lb, 8).mean, 29.0 / 32);
  EXPECT_EQ(reference(Dtype::kFloat32, lb, 4).mean, 27.0 / 32);
  EXPECT_EQ(reference(Dtype::kFloat32, fb).mean, 14.0 / 16);
  double sequential = 0;
  for (float x : lanes) sequential += x;
  EXPECT_EQ(sequential / 32, 15.0 / 32);
  for (StatsPath p : paths()) {
    ForcePath force(p);
    EXPECT_EQ(accumulate(Dtype::kFloat32, lb).mean, 30.0 / 32) << path_name(p);
    EXPECT_EQ(accumulate(Dtype::kFloat32, fb).mean, 14.0 / 16) << path_name(p);
    // The same through half precision's and float64's paths (2^60 is no half: 2^15 is).
    std::vector<double> d(lanes.begin(), lanes.end());
    EXPECT_EQ(accumulate(Dtype::kFloat64, bytes_of(d)).mean, 30.0 / 32) << path_name(p);
  }
}

// Random values from 2^-20 to 2^24, both signs: every path gives the documented order's bits,
// and that order is not the sequential one's, nor 4, 8 or 32 lanes'.
TEST(StatsOrderTest, EveryPathSumsInTheDocumentedLaneOrder) {
  const std::vector<float> v = ill_conditioned(3 * 4096 + 77, 1);
  const std::vector<uint8_t> bytes = bytes_of(v);
  const TensorStats want = reference(Dtype::kFloat32, bytes);

  double sequential = 0, sequential_sq = 0;
  for (float x : v) {
    sequential += x;
    sequential_sq += double(x) * x;
  }
  EXPECT_NE(sequential / double(v.size()), want.mean) << "the input does not pin the order";
  EXPECT_NE(std::sqrt(sequential_sq), want.l2) << "the input does not pin the order";
  for (size_t lanes : {4u, 8u, 32u}) {
    const TensorStats other = reference(Dtype::kFloat32, bytes, lanes);
    EXPECT_NE(other.mean, want.mean) << lanes << " lanes";
  }
  float float_sum = 0;  // float32 accumulation, as before issue 13
  for (float x : v) float_sum += x;
  EXPECT_NE(double(float_sum) / double(v.size()), want.mean);

  for (StatsPath p : paths()) {
    ForcePath force(p);
    EXPECT_TRUE(same_stats(accumulate(Dtype::kFloat32, bytes), want)) << path_name(p);
  }
}

// Lengths around the lanes and the blocks, NaN and Inf (the careful path, chunk by chunk, and
// the fast path after it), each dtype with float statistics.
TEST(StatsOrderTest, EveryPathEveryDtypeEveryLengthMatchesTheReference) {
  std::mt19937 g(7);
  for (size_t n :
       {0u, 1u, 15u, 16u, 17u, 33u, 1000u, 1024u, 1040u, 4096u, 4097u, 8192u, 8199u, 20000u}) {
    for (int special = 0; special < 5; ++special) {
      std::vector<float> v = ill_conditioned(n, uint32_t(n * 10 + special));
      if (n > 20) {
        if (special == 1) v[n / 2] = NAN;                         // one NaN mid-tensor
        if (special == 2) v[n - 3] = INFINITY;                    // an Inf near the end
        if (special == 3) v[5] = INFINITY, v[n - 1] = -INFINITY;  // Inf - Inf: the mean is NaN
        if (special == 4)
          for (size_t i = 0; i < n; i += 3) v[i] = NAN;  // mostly NaN
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
        const std::string what = std::string(path_name(p)) + " n=" + std::to_string(n) + " case " +
                                 std::to_string(special);
        EXPECT_TRUE(same_stats(accumulate(Dtype::kFloat32, f32), reference(Dtype::kFloat32, f32)))
            << "float32 " << what;
        EXPECT_TRUE(
            same_stats(accumulate(Dtype::kComplex64, f32), reference(Dtype::kComplex64, f32)))
            << "complex64 " << what;
        EXPECT_TRUE(same_stats(accumulate(Dtype::kFloat64, f64), reference(Dtype::kFloat64, f64)))
            << "float64 " << what;
        EXPECT_TRUE(same_stats(accumulate(Dtype::kFloat16, f16), reference(Dtype::kFloat16, f16)))
            << "float16 " << what;
        EXPECT_TRUE(same_stats(accumulate(Dtype::kBFloat16, f16), reference(Dtype::kBFloat16, f16)))
            << "bfloat16 " << what;
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
    const TensorStats st = accumulate(Dtype::kFloat32, bytes_of(v));
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
  const std::pair<Dtype, std::vector<uint8_t>> tensors[] = {{Dtype::kFloat32, bytes_of(f)},
                                                            {Dtype::kFloat16, bytes_of(h)},
                                                            {Dtype::kFloat64, bytes_of(d)}};
  for (const auto& tensor : tensors) {
    // Not a structured binding: the lambdas below capture them, which C++17 (clang) forbids.
    const Dtype dtype = tensor.first;
    const std::vector<uint8_t>& bytes = tensor.second;
    const TensorStats want = reference(dtype, bytes);
    for (StatsPath p : paths()) {
      ForcePath force(p);
      const std::string what = std::string(path_name(p)) + " dtype " +
                               std::string(trace::dtype_name(dtype));
      EXPECT_TRUE(
          same_stats(digest_stats(dtype, bytes,
                                  [&](TensorDigester& t) { t.update(bytes.data(), bytes.size()); }),
                     want))
          << what << " whole";
      for (size_t piece : {size_t(4099), size_t(333), kLeafBytes + 3}) {
        EXPECT_TRUE(same_stats(digest_stats(dtype, bytes,
                                            [&](TensorDigester& t) {
                                              for (size_t off = 0; off < bytes.size(); off += piece)
                                                t.update(bytes.data() + off,
                                                         std::min(piece, bytes.size() - off));
                                            }),
                               want))
            << what << " pieces of " << piece;
      }
      for (size_t k : {1u, 3u, 5u}) {
        const ParallelFor pool = k == 1 ? serial : threads(k);
        EXPECT_TRUE(same_stats(digest_stats(dtype, bytes,
                                            [&](TensorDigester& t) {
                                              t.update_all(bytes.data(), bytes.size(), pool);
                                            }),
                               want))
            << what << " update_all on " << k << " threads";
      }
    }
  }
}

// ---- Stored as doubles, compared as doubles ------------------------------------------------

// The statistics a trace holds are the doubles computed, not their float32 roundings.
TEST(StatsFormatTest, StatisticsRoundTripAsDoubles) {
  testing::TraceBuilder b;
  b.step(0);
  TensorDesc f = testing::tensor(0x10);
  f.stats = {-1.0 / 3, 1e300, 0.1, std::sqrt(2.0), 0, 0};
  TensorDesc i = testing::tensor(0x11, {4}, trace::Provenance::kOutput, Dtype::kInt64);
  i.bits |= trace::kTensorIntStats;
  i.stats = {-7, 1 << 20, 1.0 / 7, 0, 0, 0};
  b.op("aten::add").in_new(f).out_new(i).done();
  b.end();
  testing::RunDir run("stats_doubles/run-0");
  run.add_stream("r0.main.t0", b);
  trace::TraceReader r;
  ASSERT_TRUE(r.open(run.stream_path("r0.main.t0")).ok());
  ASSERT_EQ(r.next(), trace::ReadResult::kRecord);
  while (r.kind() != trace::RecordKind::kOp) ASSERT_EQ(r.next(), trace::ReadResult::kRecord);
  const TensorDesc* in = r.tensor(r.op().input_tensors.at(0));
  const TensorDesc* out = r.tensor(r.op().output_tensors.at(0));
  ASSERT_TRUE(in && out);
  EXPECT_EQ(in->stats.min, -1.0 / 3);
  EXPECT_EQ(in->stats.max, 1e300);  // beyond float32's range
  EXPECT_EQ(in->stats.mean, 0.1);
  EXPECT_EQ(in->stats.l2, std::sqrt(2.0));
  EXPECT_EQ(out->stats.min, -7);
  EXPECT_EQ(out->stats.max, 1 << 20);
  EXPECT_EQ(out->stats.mean, 1.0 / 7);
}

// Two runs whose output means differ by 1e-7 at 20.25: less than half a float32 ulp there
// (9.5e-7), so float32 statistics called them equal and any tolerance passed them. In double,
// rtol 1e-12 fails the gate, rtol 1e-6 passes it.
TEST(StatsFormatTest, ToleranceGateComparesDoubles) {
  const double mean_a = 20.25, mean_b = 20.25 + 1e-7;
  ASSERT_EQ(float(mean_a), float(mean_b)) << "the example must be below float32 resolution";
  auto build = [](double mean, uint8_t digest) {
    testing::TraceBuilder t;
    t.step(0);
    TensorDesc out = testing::tensor(0x21);
    out.digest[0] = digest;
    out.stats.mean = mean;
    t.op("aten::mul").in_new(testing::tensor(0x20)).in_double(0.5).out_new(out).done();
    t.end();
    return t;
  };
  testing::RunDir a("stats_gate/run-0"), b("stats_gate/run-1");
  a.add_stream("r0.main.t0", build(mean_a, 0x21));
  b.add_stream("r0.main.t0", build(mean_b, 0x22));
  auto diff = [&](double rtol) {
    DiffOptions o;
    o.gate = GateConfig{"tolerance", rtol, 0};
    DiffReport r;
    Status s = diff_runs(a.path(), b.path(), o, &r);
    EXPECT_TRUE(s.ok()) << s.message();
    return r;
  };
  DiffReport tight = diff(1e-12);
  EXPECT_EQ(tight.verdict, Verdict::kDivergent);
  EXPECT_TRUE(tight.beyond_tolerance);
  EXPECT_EQ(gate_exit_code(tight), ExitCode::kDivergent);
  ASSERT_TRUE(tight.first.has_value());
  ASSERT_EQ(tight.first->evidence.magnitude.size(), 1u);
  EXPECT_NEAR(tight.first->evidence.magnitude[0].mean, 1e-7, 1e-12);
  EXPECT_FALSE(tight.first->evidence.magnitude[0].within_tolerance);

  DiffReport loose = diff(1e-6);
  EXPECT_FALSE(loose.beyond_tolerance);
  EXPECT_EQ(gate_exit_code(loose), ExitCode::kIdentical);
}

}  // namespace
}  // namespace detaudit
