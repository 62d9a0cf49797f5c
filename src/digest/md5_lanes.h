// Up to sixteen MD5 digests computed in step, one per 32-bit lane of an AVX-512 register, or of
// two AVX2 registers of eight lanes each.
//
// MD5 is a serial chain of 32-bit operations: one message runs at about 0.6 GB/s per core,
// whatever the CPU. Equal-length messages (the 1 MiB leaves of a large tensor) run side by side
// in the vector lanes, several times faster. Each lane's digest is the standard MD5 of its
// message, bit for bit.
//
//   if (Md5Lanes::available()) {
//     Md5Lanes m(n);                   // starts every lane; the first n carry messages
//     m.update(lanes, 64 * k);         // the next 64*k bytes of each lane's message
//     m.finish(total_bytes, digests);  // total_bytes: each lane's length, a multiple of 64
//   }
//
// Messages of different lengths (Md5Batch) come padded by the caller: a lane that ends is read
// with lane_digest() and restarted for the next message, or its last lane moved into its place.
#pragma once

#include <cstddef>
#include <cstdint>

namespace detaudit {

class Md5Lanes {
 public:
  static constexpr size_t kLanes = 16;
  static constexpr size_t kBlockBytes = 64;

  // True where the CPU has AVX-512F or AVX2; otherwise nothing here may be called.
  static bool available();
  // Only the first `used` lanes' digests are wanted: with AVX2, 8 or fewer take half the work
  // (one register instead of two; two run interleaved, each filling the other's latency).
  explicit Md5Lanes(size_t used = kLanes) : used_(used) { reset(); }
  void reset();
  // Feeds the next nbytes (a multiple of 64) of each lane's message; lanes may alias.
  void update(const uint8_t* const lanes[kLanes], size_t nbytes);
  // Pads every lane for a message of total_bytes (a multiple of 64, all lanes alike) and writes
  // each lane's 16-byte digest.
  void finish(uint64_t total_bytes, uint8_t digests[kLanes][16]);

  // The first `used` lanes carry messages from now on.
  void set_used(size_t used) { used_ = used; }
  void restart_lane(size_t lane);
  void move_lane(size_t from, size_t to);
  // The lane's state as a digest: its message's MD5 once the padded message was fed whole.
  void lane_digest(size_t lane, uint8_t out[16]) const;

 private:
  alignas(64) uint32_t state_[4][kLanes];  // A, B, C, D of each lane
  size_t used_;
};

}  // namespace detaudit
