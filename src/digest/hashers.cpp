#include "digest/hashers.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstring>
#include <optional>

#include "digest/device_digest.h"
#include "digest/xxh3_wide.h"

namespace detaudit {

using trace::DigestAlgo;

const Xxh3Wide* xxh3_wide() {
#if defined(__x86_64__)
  // The CPU first: each build is compiled for its ISA throughout.
  static const Xxh3Wide* const widest = __builtin_cpu_supports("avx512f") && xxh3_avx512()
                                            ? xxh3_avx512()
                                        : __builtin_cpu_supports("avx2") && xxh3_avx2()
                                            ? xxh3_avx2()
                                            : nullptr;
  return widest;
#else
  return nullptr;
#endif
}

struct Hasher::State {
  EVP_MD_CTX* evp = nullptr;
  EVP_MD* md = nullptr;
  XXH3_state_t* xxh = nullptr;
  const Xxh3Wide* wide_build = nullptr;  // instead of xxh, where the CPU has AVX-512 or AVX2
  Xxh3WideState* wide = nullptr;
  std::optional<DeviceDigester> device;
};

Hasher::Hasher(DigestAlgo algo) : algo_(algo), state_(std::make_unique<State>()) {
  if (algo_ == DigestAlgo::kDevice) {
    // reset() makes it.
  } else if (algo_ == DigestAlgo::kXxh3 && xxh3_wide()) {
    state_->wide_build = xxh3_wide();
    state_->wide = state_->wide_build->create();
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
  if (state_->wide) state_->wide_build->destroy(state_->wide);
  if (state_->xxh) XXH3_freeState(state_->xxh);
  if (state_->evp) EVP_MD_CTX_free(state_->evp);
  if (state_->md) EVP_MD_free(state_->md);
}

void Hasher::reset() {
  if (algo_ == DigestAlgo::kDevice)
    state_->device.emplace(trace::Dtype::kUInt8, /*with_stats=*/false);
  else if (state_->wide)
    state_->wide_build->reset(state_->wide);
  else if (state_->xxh)
    XXH3_128bits_reset(state_->xxh);
  else
    EVP_DigestInit_ex(state_->evp, state_->md, nullptr);
}

void Hasher::update(const void* data, size_t n) {
  if (n == 0) return;
  if (state_->device)
    state_->device->update(data, n);
  else if (state_->wide)
    state_->wide_build->update(state_->wide, data, n);
  else if (state_->xxh)
    XXH3_128bits_update(state_->xxh, data, n);
  else
    EVP_DigestUpdate(state_->evp, data, n);
}

void Hasher::finish(uint8_t* out) {
  if (state_->device) {
    const uint64_t root = state_->device->finish().root;
    for (int i = 0; i < 8; ++i) out[i] = uint8_t(root >> (8 * i));
  } else if (state_->wide) {
    state_->wide_build->digest(state_->wide, out);
  } else if (state_->xxh) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state_->xxh));
    std::memcpy(out, c.digest, 16);
  } else {
    unsigned int len = 0;
    EVP_DigestFinal_ex(state_->evp, out, &len);
  }
}

void Hasher::digest_once(const void* data, size_t n, uint8_t* out) {
  if (state_->wide) {
    state_->wide_build->oneshot(data, n, out);
  } else if (algo_ == DigestAlgo::kXxh3) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
    std::memcpy(out, c.digest, 16);
  } else if (algo_ == DigestAlgo::kDevice) {
    DeviceDigester d(trace::Dtype::kUInt8, /*with_stats=*/false);
    d.update(data, n);
    const uint64_t root = d.finish().root;
    for (int i = 0; i < 8; ++i) out[i] = uint8_t(root >> (8 * i));
  } else {
    unsigned int len = 0;
    EVP_DigestInit_ex(state_->evp, state_->md, nullptr);
    EVP_DigestUpdate(state_->evp, data, n);
    EVP_DigestFinal_ex(state_->evp, out, &len);
  }
}

}  // namespace detaudit
