// Little-endian, LEB128 and CRC-32C primitives shared by the trace writer and reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace detaudit::trace {

uint32_t crc32c(uint32_t crc, const void* data, size_t n);

inline uint64_t zigzag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return int64_t(v >> 1) ^ -int64_t(v & 1); }

// Appends to a growable byte string; cheap enough for the op callback.
class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(char(v)); }
  void varint(uint64_t v) {
    if (v < 0x80) {  // most varints: an inline store, not a call into std::string
      out_->push_back(char(v));
      return;
    }
    char buf[10];
    int n = 0;
    while (v >= 0x80) {
      buf[n++] = char(v | 0x80);
      v >>= 7;
    }
    buf[n++] = char(v);
    out_->append(buf, n);
  }
  void zvarint(int64_t v) { varint(zigzag(v)); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void f64(double v) { raw(&v, 8); }
  void str(std::string_view s) {
    varint(s.size());
    out_->append(s.data(), s.size());
  }
  void raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }

 private:
  std::string* out_;
};

// Writes what ByteWriter writes into a buffer the caller sized for it: no bounds checks, no
// calls, for records encoded on the op's thread and appended in one piece.
class SpanWriter {
 public:
  explicit SpanWriter(char* p) : begin_(p), p_(p) {}
  void u8(uint8_t v) { *p_++ = char(v); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      *p_++ = char(v | 0x80);
      v >>= 7;
    }
    *p_++ = char(v);
  }
  void zvarint(int64_t v) { varint(zigzag(v)); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void raw(const void* p, size_t n) {
    std::memcpy(p_, p, n);
    p_ += n;
  }
  size_t size() const { return size_t(p_ - begin_); }

 private:
  char* begin_;
  char* p_;
};

// Reads what ByteWriter wrote; every read checks bounds and sets failed() instead of throwing.
class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  bool failed() const { return failed_; }
  size_t remaining() const { return size_t(end_ - p_); }
  uint8_t u8() {
    if (p_ >= end_) return fail<uint8_t>();
    return *p_++;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return fail<uint64_t>();
      uint8_t b = *p_++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return fail<uint64_t>();
  }
  int64_t zvarint() { return unzigzag(varint()); }
  uint32_t u32() {
    uint32_t v = 0;
    raw(&v, 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    raw(&v, 8);
    return v;
  }
  float f32() {
    float v = 0;
    raw(&v, 4);
    return v;
  }
  double f64() {
    double v = 0;
    raw(&v, 8);
    return v;
  }
  std::string_view str() {
    uint64_t n = varint();
    if (n > remaining()) return fail<std::string_view>();
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  void raw(void* dst, size_t n) {
    if (n > remaining()) {
      failed_ = true;
      p_ = end_;
      return;
    }
    std::memcpy(dst, p_, n);
    p_ += n;
  }
  void skip(size_t n) {
    if (n > remaining()) {
      failed_ = true;
      p_ = end_;
      return;
    }
    p_ += n;
  }

 private:
  template <typename T>
  T fail() {
    failed_ = true;
    p_ = end_;
    return T{};
  }
  const uint8_t* p_;
  const uint8_t* end_;
  bool failed_ = false;
};

}  // namespace detaudit::trace
