#include "digest/digest.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstring>
#include <limits>

#include "digest/md5_lanes.h"
#include "digest/xxh3_wide.h"

namespace detaudit {

using trace::DigestAlgo;

bool xxh3_wide_available() {
#if defined(__x86_64__)
  // The CPU first: xxh3_wide.cpp is compiled for AVX-512 throughout.
  static const bool yes = __builtin_cpu_supports("avx512f") && xxh3_wide_compiled();
  return yes;
#else
  return false;
#endif
}

struct Hasher::State {
  EVP_MD_CTX* evp = nullptr;
  EVP_MD* md = nullptr;
  XXH3_state_t* xxh = nullptr;
  Xxh3WideState* wide = nullptr;  // instead of xxh, where the CPU has AVX-512
};

Hasher::Hasher(DigestAlgo algo) : algo_(algo), state_(std::make_unique<State>()) {
  if (algo_ == DigestAlgo::kXxh3 && xxh3_wide_available()) {
    state_->wide = xxh3_wide_create();
  } else if (algo_ == DigestAlgo::kXxh3) {
    state_->xxh = XXH3_createState();
  } else {
    // Fetched once: the implicit fetch in EVP_DigestInit_ex costs more than hashing small tensors.
    state_->md = EVP_MD_fetch(nullptr, algo_ == DigestAlgo::kMd5 ? "MD5" : "SHA256", nullptr);
    state_->evp = EVP_MD_CTX_new();
  }
  reset();
}

Hasher::~Hasher() {
  if (state_->wide) xxh3_wide_free(state_->wide);
  if (state_->xxh) XXH3_freeState(state_->xxh);
  if (state_->evp) EVP_MD_CTX_free(state_->evp);
  if (state_->md) EVP_MD_free(state_->md);
}

void Hasher::reset() {
  if (state_->wide)
    xxh3_wide_reset(state_->wide);
  else if (state_->xxh)
    XXH3_128bits_reset(state_->xxh);
  else
    EVP_DigestInit_ex(state_->evp, state_->md, nullptr);
}

void Hasher::update(const void* data, size_t n) {
  if (n == 0) return;
  if (state_->wide)
    xxh3_wide_update(state_->wide, data, n);
  else if (state_->xxh)
    XXH3_128bits_update(state_->xxh, data, n);
  else
    EVP_DigestUpdate(state_->evp, data, n);
}

void Hasher::finish(uint8_t* out) {
  if (state_->wide) {
    xxh3_wide_digest(state_->wide, out);
  } else if (state_->xxh) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state_->xxh));
    std::memcpy(out, c.digest, 16);
  } else {
    unsigned int len = 0;
    EVP_DigestFinal_ex(state_->evp, out, &len);
  }
}

namespace {

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

StatsAccumulator::StatsAccumulator(uint8_t dtype)
    : min_(std::numeric_limits<double>::infinity()),
      max_(-std::numeric_limits<double>::infinity()),
      imin_(std::numeric_limits<int64_t>::max()),
      imax_(std::numeric_limits<int64_t>::min()) {
  switch (dtype) {
    case 0: kind_ = Kind::kUnsigned; elem_size_ = 1; break;   // uint8
    case 11: kind_ = Kind::kUnsigned; elem_size_ = 1; break;  // bool
    case 1: kind_ = Kind::kSigned; elem_size_ = 1; break;
    case 2: kind_ = Kind::kSigned; elem_size_ = 2; break;
    case 3: kind_ = Kind::kSigned; elem_size_ = 4; break;
    case 4: kind_ = Kind::kSigned; elem_size_ = 8; break;
    case 5: kind_ = Kind::kHalf; elem_size_ = 2; break;
    case 6: kind_ = Kind::kFloat; elem_size_ = 4; break;
    case 7: kind_ = Kind::kDouble; elem_size_ = 8; break;
    case 9: kind_ = Kind::kFloat; elem_size_ = 4; break;   // complex64: over components
    case 10: kind_ = Kind::kDouble; elem_size_ = 8; break; // complex128
    case 15: kind_ = Kind::kBFloat16; elem_size_ = 2; break;
    default: kind_ = Kind::kNone; break;
  }
}

namespace {

// Min/max/sum over a block of floats, accumulated in float per short block so the compiler can
// vectorise it, then folded into doubles. NaN and Inf are tested on the bits: std::isnan and
// std::isinf calls keep the loop scalar.
struct FloatBlock {
  float mn = std::numeric_limits<float>::infinity();
  float mx = -std::numeric_limits<float>::infinity();
  double sum = 0, sumsq = 0;
  uint64_t count = 0, nan = 0, inf = 0;
};

// The scalar path, for tails and non-x86 machines.
void float32_scalar(const float* x, size_t n, FloatBlock* b) {
  float s = 0, sq = 0;
  for (size_t j = 0; j < n; ++j) {
    const float v = x[j];
    if (v != v) {
      ++b->nan;
      continue;
    }
    b->inf += std::isinf(v);
    s += v;
    sq += v * v;
    b->mn = std::min(b->mn, v);
    b->mx = std::max(b->mx, v);
    ++b->count;
  }
  b->sum += s;
  b->sumsq += sq;
}

#if defined(__x86_64__)
// The careful path: tests every element for NaN and Inf. Four lanes of SSE2 (the x86-64
// baseline). Each lane's sums run in a fixed order, so the same data always gives the same
// statistics, with no -ffast-math.
void float32_careful(const float* x, size_t n, FloatBlock* b) {
  constexpr size_t kInner = 1024;  // short float sums, folded into doubles
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128 inf = _mm_castsi128_ps(_mm_set1_epi32(0x7f800000));
  __m128 mn = _mm_set1_ps(b->mn), mx = _mm_set1_ps(b->mx);
  uint64_t vector_nans = 0;
  size_t i = 0;
  for (; i + 4 <= n;) {
    const size_t end = std::min(n - n % 4, i + kInner);
    __m128 s = _mm_setzero_ps(), sq = _mm_setzero_ps();
    __m128i nans = _mm_setzero_si128(), infs = _mm_setzero_si128();
    for (; i < end; i += 4) {
      const __m128 v = _mm_loadu_ps(x + i);
      const __m128 is_nan = _mm_cmpunord_ps(v, v);
      const __m128 is_inf = _mm_cmpeq_ps(_mm_and_ps(v, abs_mask), inf);
      nans = _mm_sub_epi32(nans, _mm_castps_si128(is_nan));
      infs = _mm_sub_epi32(infs, _mm_castps_si128(is_inf));
      const __m128 z = _mm_andnot_ps(is_nan, v);  // NaN -> 0 for the sums
      s = _mm_add_ps(s, z);
      sq = _mm_add_ps(sq, _mm_mul_ps(z, z));
      // min/max skip NaN: with a NaN first operand, minps/maxps yield the second.
      mn = _mm_min_ps(v, mn);
      mx = _mm_max_ps(v, mx);
    }
    alignas(16) float sf[4], sqf[4];
    alignas(16) uint32_t nf[4], inff[4];
    _mm_store_ps(sf, s);
    _mm_store_ps(sqf, sq);
    _mm_store_si128(reinterpret_cast<__m128i*>(nf), nans);
    _mm_store_si128(reinterpret_cast<__m128i*>(inff), infs);
    for (int l = 0; l < 4; ++l) {
      b->sum += sf[l];
      b->sumsq += sqf[l];
      vector_nans += nf[l];
      b->inf += inff[l];
    }
  }
  alignas(16) float mnf[4], mxf[4];
  _mm_store_ps(mnf, mn);
  _mm_store_ps(mxf, mx);
  for (int l = 0; l < 4; ++l) {
    b->mn = std::min(b->mn, mnf[l]);
    b->mx = std::max(b->mx, mxf[l]);
  }
  b->nan += vector_nans;
  b->count += i - vector_nans;
  float32_scalar(x + i, n - i, b);
}

// The fast path, for blocks of finite floats: four independent AVX2 accumulators and no
// per-element tests. min/max skip NaN by operand order (a NaN first operand yields the second).
// Returns false, having changed nothing, if the block's sums are not finite: a NaN, an Inf or an
// overflow, which the careful path then counts.
__attribute__((target("avx2"))) bool float32_fast_avx2(const float* x, size_t n, FloatBlock* b) {
  __m256 s[4], q[4], mn[4], mx[4];
  for (int k = 0; k < 4; ++k) {
    s[k] = q[k] = _mm256_setzero_ps();
    mn[k] = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    mx[k] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (size_t i = 0; i < n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
      s[k] = _mm256_add_ps(s[k], v);
      q[k] = _mm256_add_ps(q[k], _mm256_mul_ps(v, v));
      mn[k] = _mm256_min_ps(v, mn[k]);
      mx[k] = _mm256_max_ps(v, mx[k]);
    }
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
  const __m256 sumsq = _mm256_add_ps(_mm256_add_ps(q[0], q[1]), _mm256_add_ps(q[2], q[3]));
  alignas(32) float sf[8], qf[8], mnf[8], mxf[8];
  _mm256_store_ps(sf, sum);
  _mm256_store_ps(qf, sumsq);
  double ds = 0, dq = 0;
  for (int l = 0; l < 8; ++l) {
    if (!std::isfinite(sf[l]) || !std::isfinite(qf[l])) return false;
    ds += sf[l];
    dq += qf[l];
  }
  _mm256_store_ps(mnf, _mm256_min_ps(_mm256_min_ps(mn[0], mn[1]), _mm256_min_ps(mn[2], mn[3])));
  _mm256_store_ps(mxf, _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3])));
  for (int l = 0; l < 8; ++l) {
    b->mn = std::min(b->mn, mnf[l]);
    b->mx = std::max(b->mx, mxf[l]);
  }
  b->sum += ds;
  b->sumsq += dq;
  b->count += n;
  return true;
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// Blocks of up to 1024 floats take the fast path when they are all finite; the path depends only on the
// data, so the same data always gives the same statistics.
void float32_block(const float* x, size_t n, FloatBlock* b) {
  constexpr size_t kFast = 1024;  // floats summed in float before folding into double
  size_t i = 0;
  if (has_avx2()) {
    while (n - i >= 32) {  // small tensors too: a 4x32 activation is 4 rounds of the fast loop
      const size_t m = std::min(kFast, (n - i) / 32 * 32);
      if (!float32_fast_avx2(x + i, m, b)) float32_careful(x + i, m, b);
      i += m;
    }
  }
  float32_careful(x + i, n - i, b);
}
#else
void float32_block(const float* x, size_t n, FloatBlock* b) { float32_scalar(x, n, b); }
#endif

// Half and bfloat16 widen into a small float buffer, then take the float32 path.
template <typename Widen>
void widened_block(const uint8_t* p, size_t n, Widen widen, FloatBlock* b) {
  float buf[512];
  for (size_t i = 0; i < n; i += 512) {
    const size_t m = std::min<size_t>(512, n - i);
    for (size_t j = 0; j < m; ++j) {
      uint16_t h;
      std::memcpy(&h, p + 2 * (i + j), 2);
      buf[j] = widen(h);
    }
    float32_block(buf, m, b);
  }
}

}  // namespace

void StatsAccumulator::update(const void* data, size_t nbytes) {
  if (kind_ == Kind::kNone) return;
  const auto* p = static_cast<const uint8_t*>(data);
  size_t n = nbytes / elem_size_;
  switch (kind_) {
    case Kind::kFloat:
    case Kind::kHalf:
    case Kind::kBFloat16: {
      FloatBlock b;
      if (kind_ == Kind::kFloat)
        float32_block(reinterpret_cast<const float*>(p), n, &b);  // tensor data is float-aligned
      else if (kind_ == Kind::kHalf)
        widened_block(p, n, half_to_float, &b);
      else
        widened_block(p, n, bf16_to_float, &b);
      if (b.count) {
        min_ = std::min(min_, double(b.mn));
        max_ = std::max(max_, double(b.mx));
      }
      sum_ += b.sum;
      sumsq_ += b.sumsq;
      count_ += b.count;
      nan_ += b.nan;
      inf_ += b.inf;
      break;
    }
    case Kind::kDouble:
      for (size_t i = 0; i < n; ++i) {
        double x;
        std::memcpy(&x, p + i * 8, 8);
        if (x != x) { ++nan_; continue; }
        inf_ += std::isinf(x);
        min_ = std::min(min_, x);
        max_ = std::max(max_, x);
        sum_ += x;
        sumsq_ += x * x;
        ++count_;
      }
      break;
    case Kind::kSigned:
    case Kind::kUnsigned:
      for (size_t i = 0; i < n; ++i) {
        int64_t v = 0;
        const uint8_t* q = p + i * elem_size_;
        if (kind_ == Kind::kUnsigned) {
          v = *q;
        } else if (elem_size_ == 1) {
          v = int8_t(*q);
        } else if (elem_size_ == 2) {
          int16_t x; std::memcpy(&x, q, 2); v = x;
        } else if (elem_size_ == 4) {
          int32_t x; std::memcpy(&x, q, 4); v = x;
        } else {
          std::memcpy(&v, q, 8);
        }
        imin_ = std::min(imin_, v);
        imax_ = std::max(imax_, v);
        sum_ += double(v);
      }
      count_ += n;
      break;
    case Kind::kNone:
      break;
  }
}

trace::TensorStats StatsAccumulator::finish() const {
  trace::TensorStats s;
  s.nan = nan_;
  s.inf = inf_;
  if (count_ == 0) return s;
  if (integral()) {
    s.min = double(imin_);
    s.max = double(imax_);
  } else {
    s.min = min_;
    s.max = max_;
    s.l2 = std::sqrt(sumsq_);
  }
  s.mean = sum_ / double(count_);
  return s;
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

namespace {

constexpr size_t kStatsBlock = kStatsBlockBytes;

// One leaf, contiguous, in one call: what the streaming path computes for the same bytes.
void digest_leaf(Hasher* h, const uint8_t* p, size_t n, bool with_stats, uint8_t* digest,
                 StatsAccumulator* stats) {
  h->reset();
  for (size_t off = 0; off < n; off += kStatsBlock) {
    const size_t m = std::min(kStatsBlock, n - off);
    h->update(p + off, m);
    if (with_stats) stats->update(p + off, m);
  }
  h->finish(digest);
}

// A hasher per thread and algorithm, for the leaves a pool thread hashes.
Hasher& thread_hasher(DigestAlgo algo) {
  thread_local std::unique_ptr<Hasher> hashers[4];
  auto& h = hashers[size_t(algo) & 3];
  if (!h || h->algo() != algo) h = std::make_unique<Hasher>(algo);
  return *h;
}

}  // namespace

TensorDigester::TensorDigester(Hasher* hasher, uint8_t dtype, bool with_stats)
    : hasher_(hasher), dtype_(dtype), leaf_stats_(dtype) {
  with_stats_ = with_stats && leaf_stats_.supported();
  hasher_->reset();
}

void TensorDigester::update(const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_ += nbytes;
  while (nbytes > 0) {
    // A leaf closes only when more bytes follow: a tensor of exactly one leaf is hashed plain.
    if (leaf_used_ == kLeafBytes) close_leaf();
    const size_t take = std::min(nbytes, kLeafBytes - leaf_used_);
    feed_leaf(p, take);
    p += take;
    nbytes -= take;
  }
}

void TensorDigester::feed_leaf(const uint8_t* p, size_t n) {
  leaf_used_ += n;
  hasher_->update(p, n);
  if (!with_stats_) return;
  if (carry_used_ > 0) {
    const size_t take = std::min(n, kStatsBlock - carry_used_);
    std::memcpy(carry_.data() + carry_used_, p, take);
    carry_used_ += take;
    p += take;
    n -= take;
    if (carry_used_ < kStatsBlock) return;
    leaf_stats_.update(carry_.data(), carry_used_);
    carry_used_ = 0;
  }
  for (; n >= kStatsBlock; p += kStatsBlock, n -= kStatsBlock) leaf_stats_.update(p, kStatsBlock);
  std::memcpy(carry_.data(), p, n);
  carry_used_ = n;
}

void TensorDigester::flush_carry() {
  if (carry_used_ > 0) leaf_stats_.update(carry_.data(), carry_used_);
  carry_used_ = 0;
}

void TensorDigester::close_leaf() {
  flush_carry();
  closed_.emplace_back(dtype_);
  hasher_->finish(closed_.back().digest.data());
  closed_.back().stats = leaf_stats_;
  hasher_->reset();
  leaf_stats_ = StatsAccumulator(dtype_);
  leaf_used_ = 0;
}

void TensorDigester::update_all(const void* data, size_t nbytes, const ParallelFor& parallel) {
  if (nbytes <= kLeafBytes || bytes_ != 0) {
    update(data, nbytes);
    return;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t leaves = (nbytes + kLeafBytes - 1) / kLeafBytes;
  closed_.assign(leaves, Leaf(dtype_));
  const DigestAlgo algo = hasher_->algo();
  const bool with_stats = with_stats_;
  // MD5 of whole leaves runs 16 at a time in vector lanes; a pass costs the same for 2 leaves as
  // for 16, so the leaves are spread over as few passes as there must be.
  const size_t full = nbytes / kLeafBytes;
  const bool lanes = algo == DigestAlgo::kMd5 && full >= 2 && Md5Lanes::available();
  const size_t passes = lanes ? (full + Md5Lanes::kLanes - 1) / Md5Lanes::kLanes : 0;
  const size_t first_single = lanes ? full : 0;  // leaves from here on are hashed one by one
  parallel(passes + leaves - first_single, [&](size_t begin, size_t end) {
    for (size_t unit = begin; unit < end; ++unit) {
      if (unit < passes) {
        const size_t from = full * unit / passes, to = full * (unit + 1) / passes;
        digest_leaves_md5(p, from, to);
        continue;
      }
      const size_t i = first_single + (unit - passes);
      const size_t off = i * kLeafBytes;
      digest_leaf(&thread_hasher(algo), p + off, std::min(kLeafBytes, nbytes - off), with_stats,
                  closed_[i].digest.data(), &closed_[i].stats);
    }
  });
  bytes_ = nbytes;
}

void TensorDigester::digest_leaves_md5(const uint8_t* p, size_t from, size_t to) {
  const size_t n = to - from;
  const uint8_t* lane[Md5Lanes::kLanes];
  for (size_t l = 0; l < Md5Lanes::kLanes; ++l)  // spare lanes hash leaf `from` again, unread
    lane[l] = p + (from + (l < n ? l : 0)) * kLeafBytes;
  Md5Lanes md5;
  // Block by block, so the statistics read what the hash just brought into cache.
  for (size_t off = 0; off < kLeafBytes; off += kStatsBlock) {
    md5.update(lane, kStatsBlock);
    for (size_t l = 0; with_stats_ && l < n; ++l) closed_[from + l].stats.update(lane[l], kStatsBlock);
    for (const uint8_t*& q : lane) q += kStatsBlock;
  }
  uint8_t digests[Md5Lanes::kLanes][16];
  md5.finish(kLeafBytes, digests);
  for (size_t l = 0; l < n; ++l) std::memcpy(closed_[from + l].digest.data(), digests[l], 16);
}

void TensorDigester::finish(trace::TensorDesc* out) {
  StatsAccumulator total(dtype_);
  if (closed_.empty()) {
    flush_carry();
    hasher_->finish(out->digest.data());
    total = leaf_stats_;
  } else {
    if (leaf_used_ > 0) close_leaf();
    // The root: a header that no plain tensor of these bytes could collide with by accident,
    // then the leaves' digests in order.
    static constexpr char kTreeTag[16] = "detaudit-tree-1";
    const uint64_t sizes[2] = {kLeafBytes, bytes_};
    hasher_->reset();
    hasher_->update(kTreeTag, sizeof kTreeTag);
    hasher_->update(sizes, sizeof sizes);  // little-endian on every platform we build for
    for (const Leaf& leaf : closed_) {
      hasher_->update(leaf.digest.data(), hasher_->length());
      total.merge(leaf.stats);
    }
    hasher_->finish(out->digest.data());
    closed_.clear();
  }
  out->digest_len = uint8_t(hasher_->length());
  out->bits &= uint8_t(~(trace::kTensorHasStats | trace::kTensorIntStats | trace::kTensorHasNanInf));
  if (!with_stats_) return;
  out->stats = total.finish();
  out->bits |= trace::kTensorHasStats;
  if (total.integral()) out->bits |= trace::kTensorIntStats;
  if (out->stats.nan || out->stats.inf) out->bits |= trace::kTensorHasNanInf;
}

}  // namespace detaudit
