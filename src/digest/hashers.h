// Byte hashers: MD5 and SHA-256 via OpenSSL, XXH3-128 (AVX-512 where the CPU has it), and the
// device digest's CPU reference (device_digest.h). One interface, picked by the trace's algo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trace/format.h"

namespace detaudit {

class Hasher {
 public:
  explicit Hasher(trace::DigestAlgo algo);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  trace::DigestAlgo algo() const { return algo_; }
  size_t length() const { return trace::digest_length(algo_); }
  void reset();
  void update(const void* data, size_t n);
  void finish(uint8_t* out);  // length() bytes; reset() before reuse
  // The digest of n bytes in one call, as reset(), update(), finish() give it, without the
  // streaming state's copies (most of the cost on a small tensor). reset() before the next update().
  void digest_once(const void* data, size_t n, uint8_t* out);

 private:
  struct State;
  trace::DigestAlgo algo_;
  std::unique_ptr<State> state_;
};

}  // namespace detaudit
