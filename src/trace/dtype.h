// A tensor's element type, as the trace stores it: c10::ScalarType's numbering, stable since 1.x,
// so a code means the same dtype in every torch the interposer is built for. Torch-free and
// usable in device code (the digest kernel reads elements by it, digest/lane_digest.h).
#pragma once

#include <cstdint>

namespace detaudit::trace {

enum class Dtype : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kComplex32 = 8,
  kComplex64 = 9,
  kComplex128 = 10,
  kBool = 11,
  kQInt8 = 12,
  kQUInt8 = 13,
  kQInt32 = 14,
  kBFloat16 = 15,
  kQUInt4x2 = 16,
  kQUInt2x4 = 17,
  kBits1x8 = 18,
  kBits2x4 = 19,
  kBits4x2 = 20,
  kBits8 = 21,
  kBits16 = 22,
  kFloat8E5m2 = 23,
  kFloat8E4m3fn = 24,
  // Later codes (newer torches' float8 and unsigned kinds) are kept as read, named "unknown".
};

}  // namespace detaudit::trace
