// The device digest's CPU reference against its spec (docs/trace-format.md, "The device digest"):
// the reference streams, the spec below is written straight from the doc over a whole buffer.
// The GPU kernel is checked against the same reference on a device (tests/gpu/).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "digest/digest.h"
#include "digest/strided.h"
#include "strided_reference.h"

namespace detaudit {
namespace {

using namespace lanes;
using trace::Dtype;

struct SpecResult {
  uint64_t root;
  LaneStats stats;
};

// The spec, read literally: words, leaves, lanes, the lane fold, the leaf sum, and the leaves'
// statistics folded level by level (an odd one out goes up a level as it is).
SpecResult spec_digest(const std::vector<uint8_t>& bytes, Dtype dtype) {
  const size_t n = bytes.size();
  std::vector<uint8_t> padded(bytes);
  padded.resize((n + 7) / 8 * 8, 0);
  const size_t words = padded.size() / 8;
  const ElementType type = element_type(dtype);
  const size_t total_elements = n / type.size;
  uint64_t sum = 0;
  std::vector<LaneStats> level;
  for (size_t leaf = 0; leaf * kLeafWords < words; ++leaf) {
    uint64_t acc[kLanes];
    LaneStats st[kLanes];
    for (uint32_t l = 0; l < kLanes; ++l) {
      acc[l] = lane_seed(leaf, l);
      st[l] = empty_stats();
    }
    const size_t first = leaf * kLeafWords;
    const size_t count = std::min<size_t>(kLeafWords, words - first);
    for (size_t k = 0; k < count; ++k) {
      uint64_t w = 0;
      for (int b = 0; b < 8; ++b) w |= uint64_t(padded[8 * (first + k) + size_t(b)]) << (8 * b);
      const uint32_t lane = uint32_t(k % kLanes);
      acc[lane] = xxh64_round(acc[lane], w);
      for (uint32_t j = 0; j < 8u / type.size; ++j) {
        const size_t element = (8 * (first + k)) / type.size + j;
        if (type.kind != ElementKind::kNone && element < total_elements)
          add_element(&st[lane], element_of_word(w, type, j), is_floating(type.kind));
      }
    }
    for (uint32_t width = kLanes / 2; width >= 1; width /= 2)
      for (uint32_t l = 0; l < width; ++l) {
        acc[l] = fold_hash(acc[l], acc[l + width]);
        fold_stats(&st[l], st[l + width]);
      }
    sum += leaf_hash(acc[0], uint32_t(count));
    level.push_back(st[0]);
  }
  while (level.size() > 1) {
    std::vector<LaneStats> up;
    for (size_t i = 0; i < level.size(); i += 2) {
      LaneStats s = level[i];
      if (i + 1 < level.size()) fold_stats(&s, level[i + 1]);
      up.push_back(s);
    }
    level.swap(up);
  }
  return {root_hash(sum, n), level.empty() ? empty_stats() : level[0]};
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

// Finite values of mixed magnitude: their sums round differently in any other order, which
// random bytes (mostly huge, Inf or NaN as floats) would hide.
std::vector<uint8_t> finite_values(size_t n, Dtype dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<uint8_t> v(n);
  const size_t esize = trace::dtype_size(dtype);
  for (size_t off = 0; off + esize <= n; off += esize) {
    const double x = normal(rng) * std::ldexp(1.0, int(rng() % 20) - 10);
    if (esize == 8) {
      std::memcpy(&v[off], &x, 8);
    } else if (esize == 4) {
      const float f = float(x);
      std::memcpy(&v[off], &f, 4);
    } else {  // float16 and bfloat16: the top half of a float is a bfloat16; either is finite
      const float f = float(x) * (dtype == Dtype::kFloat16 ? 1e-4f : 1.f);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t h = dtype == Dtype::kFloat16
                             ? uint16_t(((bits >> 16) & 0x8000) | ((bits >> 13) & 0x3ff) | 0x1000)
                             : uint16_t(bits >> 16);
      std::memcpy(&v[off], &h, 2);
    }
  }
  return v;
}

bool same_stats(const LaneStats& a, const LaneStats& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;  // bit for bit, NaN-free by construction
}

LaneResult reference(const std::vector<uint8_t>& bytes, Dtype dtype, size_t chunk) {
  DeviceDigester d(dtype);
  for (size_t off = 0; off < bytes.size(); off += chunk)
    d.update(bytes.data() + off, std::min(chunk, bytes.size() - off));
  return d.finish();
}

const Dtype kDtypes[] = {Dtype::kUInt8,     Dtype::kInt8,       Dtype::kInt16,   Dtype::kInt32,
                         Dtype::kInt64,     Dtype::kFloat16,    Dtype::kFloat32, Dtype::kFloat64,
                         Dtype::kComplex64, Dtype::kComplex128, Dtype::kBool,    Dtype::kBFloat16,
                         Dtype::kComplex32 /* no stats */};

TEST(DeviceDigestTest, PrimitivesAreXxh64s) {
  // XXH64 of 32 bytes, seed 0, from our round and avalanche: its four lanes and its merge.
  const std::vector<uint8_t> in = random_bytes(32, 7);
  uint64_t v[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  for (int i = 0; i < 4; ++i) {
    uint64_t w;
    std::memcpy(&w, in.data() + 8 * i, 8);
    v[i] = xxh64_round(v[i], w);
  }
  uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
  for (uint64_t x : v) h = (h ^ xxh64_round(0, x)) * kP1 + kP4;
  h = xxh64_avalanche(h + 32);
  EXPECT_EQ(h, XXH64(in.data(), in.size(), 0));
}

TEST(DeviceDigestTest, ReferenceEqualsSpecForEveryDtypeAndSize) {
  // Empty, shorter than a word, odd, around a leaf, several leaves with a ragged last one, and a
  // leaf count (7) whose statistics tree carries odd ones up twice.
  const size_t sizes[] = {0, 1, 6, 8, 9, 24, 4095, 4096, 4104, 2 * 4096 + 16, 6 * 4096 + 8};
  for (Dtype dtype : kDtypes) {
    const size_t esize = trace::dtype_size(dtype);
    for (size_t n : sizes) {
      if (n % esize) continue;
      const bool floating = is_floating(element_type(dtype).kind) || dtype == Dtype::kComplex64 ||
                            dtype == Dtype::kComplex128;
      for (const auto& bytes :
           {random_bytes(n, uint32_t(n * 31 + uint8_t(dtype))),
            floating ? finite_values(n, dtype, uint32_t(n)) : random_bytes(n, 1)}) {
        const SpecResult want = spec_digest(bytes, dtype);
        for (size_t chunk : {size_t(1), size_t(5), size_t(4096), size_t(1) << 20}) {
          const LaneResult got = reference(bytes, dtype, chunk);
          EXPECT_EQ(got.root, want.root)
              << "dtype " << trace::dtype_name(dtype) << " n " << n << " chunk " << chunk;
          // Random bytes hold NaNs in float dtypes: they are counted, never summed.
          EXPECT_TRUE(same_stats(got.stats, want.stats))
              << "dtype " << trace::dtype_name(dtype) << " n " << n;
        }
      }
    }
  }
}

TEST(DeviceDigestTest, StatisticsAreTheElementsStatistics) {
  std::vector<float> x = {1.5f, -2.f, NAN, 4.f, INFINITY, 0.25f, -0.f, 3.f, 8.f};
  std::vector<uint8_t> bytes(x.size() * 4);
  std::memcpy(bytes.data(), x.data(), bytes.size());
  Hasher h(trace::DigestAlgo::kDevice);
  TensorDigester d(&h, Dtype::kFloat32, true);
  d.update(bytes.data(), bytes.size());
  trace::TensorDesc desc;
  d.finish(&desc);
  EXPECT_EQ(desc.digest_len, 8);
  EXPECT_EQ(desc.stats.nan, 1u);
  EXPECT_EQ(desc.stats.inf, 1u);
  EXPECT_EQ(desc.stats.min, -2.0);
  EXPECT_TRUE(std::isinf(desc.stats.max));
  EXPECT_TRUE(desc.bits & trace::kTensorHasNanInf);

  std::vector<int32_t> ints = {5, -3, 7, 1};
  TensorDigester di(&h, Dtype::kInt32, true);
  di.update(ints.data(), ints.size() * 4);
  di.finish(&desc);
  EXPECT_EQ(desc.stats.min, -3.0);
  EXPECT_EQ(desc.stats.max, 7.0);
  EXPECT_EQ(desc.stats.mean, 2.5);
  EXPECT_TRUE(desc.bits & trace::kTensorIntStats);

  // Finite floats: the lane sums are the elements' sum, up to rounding.
  std::vector<float> f(5000);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  double sum = 0, sumsq = 0;
  for (float& v : f) {
    v = normal(rng);
    sum += v;
    sumsq += double(v) * v;
  }
  TensorDigester df(&h, Dtype::kFloat32, true);
  df.update(f.data(), f.size() * 4);
  df.finish(&desc);
  EXPECT_NEAR(desc.stats.mean, sum / double(f.size()), 1e-12);
  EXPECT_NEAR(desc.stats.l2, std::sqrt(sumsq), 1e-9);
}

TEST(DeviceDigestTest, EveryByteAndItsPositionCount) {
  auto bytes = random_bytes(3 * 4096 + 40, 11);
  const uint64_t base = reference(bytes, Dtype::kUInt8, 4096).root;
  // One bit anywhere, and two words swapped within a lane, across lanes and across leaves.
  for (size_t pos : {size_t(0), size_t(4095), size_t(8191), bytes.size() - 1}) {
    auto flipped = bytes;
    flipped[pos] ^= 1;
    EXPECT_NE(reference(flipped, Dtype::kUInt8, 4096).root, base) << pos;
  }
  for (auto [a, b] : {std::pair<size_t, size_t>{0, 32}, {0, 1}, {0, 512}, {5, 1030}}) {
    auto swapped = bytes;
    for (int i = 0; i < 8; ++i) std::swap(swapped[8 * a + size_t(i)], swapped[8 * b + size_t(i)]);
    ASSERT_NE(std::memcmp(swapped.data(), bytes.data(), bytes.size()), 0);
    EXPECT_NE(reference(swapped, Dtype::kUInt8, 4096).root, base) << a << "<->" << b;
  }
  // Trailing zeros are bytes too: the length is in the root.
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_NE(reference(longer, Dtype::kUInt8, 4096).root, base);
  EXPECT_NE(reference({}, Dtype::kUInt8, 1).root, reference({0}, Dtype::kUInt8, 1).root);
}

// A fill's digest, computed from its value alone (a fill_ or zero_ the batches never read), is
// the digest of the bytes the fill writes, statistics included.
TEST(DeviceDigestTest, AFillIsDigestedAsItsBytes) {
  for (Dtype dtype : kDtypes) {
    const size_t esize = trace::dtype_size(dtype);
    const auto element = random_bytes(esize, uint8_t(dtype));
    // Within a word, a ragged word, a leaf, across a chunk of the fill's and several leaves.
    for (uint64_t count :
         {uint64_t(1), uint64_t(3), 4096 / esize, 4096 / esize + 1, uint64_t(5000)}) {
      std::vector<uint8_t> bytes(size_t(count) * esize);
      for (uint64_t i = 0; i < count; ++i) std::memcpy(&bytes[i * esize], element.data(), esize);
      const LaneResult want = reference(bytes, dtype, bytes.size());
      const LaneResult got = device_digest_of_fill(dtype, element.data(), esize, count);
      EXPECT_EQ(got.root, want.root) << "dtype " << trace::dtype_name(dtype) << " count " << count;
      EXPECT_TRUE(same_stats(got.stats, want.stats))
          << "dtype " << trace::dtype_name(dtype) << " count " << count;
    }
  }
}

TEST(DeviceDigestTest, HasherAndDigesterAgree) {
  const auto bytes = random_bytes(10000, 5);
  Hasher h(trace::DigestAlgo::kDevice);
  h.update(bytes.data(), 7);
  h.update(bytes.data() + 7, bytes.size() - 7);
  uint8_t out[8];
  h.finish(out);
  uint64_t root = 0;
  for (int i = 0; i < 8; ++i) root |= uint64_t(out[i]) << (8 * i);
  EXPECT_EQ(root, device_digest(bytes.data(), bytes.size()));
  EXPECT_EQ(root, spec_digest(bytes, Dtype::kUInt8).root);
}

// A view's digest is the digest of its elements in logical order, whatever its strides.
TEST(DeviceDigestTest, ViewsAreDigestedInLogicalOrder) {
  struct View {
    const char* what;
    std::vector<int64_t> sizes, strides;
    int64_t offset;  // elements
  };
  // A 6 x 10 base of each dtype.
  const View views[] = {
      {"transposed", {10, 6}, {1, 10}, 0},
      {"column slice with an offset", {6, 3}, {10, 1}, 4},
      {"every other row and column", {3, 5}, {20, 2}, 1},
      {"expanded row (zero stride)", {7, 10}, {0, 1}, 20},
      {"expanded scalar", {4, 3}, {0, 0}, 59},
      {"size-1 dims around a column", {1, 6, 1}, {60, 10, 1}, 9},
      {"empty", {0, 10}, {10, 1}, 0},
  };
  for (Dtype dtype : kDtypes) {
    const size_t esize = trace::dtype_size(dtype);
    const auto base = random_bytes(60 * esize, uint8_t(dtype));
    for (const View& v : views) {
      const std::vector<uint8_t> logical = logical_bytes(base, esize, v.sizes, v.strides, v.offset);
      int64_t numel = 1;
      for (int64_t s : v.sizes) numel *= s;
      const SpecResult want = spec_digest(logical, dtype);
      Hasher h(trace::DigestAlgo::kDevice);
      TensorDigester digester(&h, dtype, true);
      if (numel > 0)
        feed_strided(base.data() + v.offset * int64_t(esize), esize, v.sizes.data(),
                     v.strides.data(), v.sizes.size(), &digester);
      trace::TensorDesc got;
      digester.finish(&got);
      trace::TensorDesc spec_desc;
      lane_result_to_desc({want.root, want.stats}, dtype, true, &spec_desc);
      EXPECT_TRUE(got.same_digest(spec_desc)) << v.what << ", dtype " << trace::dtype_name(dtype);
      EXPECT_EQ(std::memcmp(&got.stats, &spec_desc.stats, sizeof got.stats), 0)
          << v.what << ", dtype " << trace::dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace detaudit
