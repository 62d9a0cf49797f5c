#include "trace/format.h"

namespace detaudit::trace {
namespace {

struct DtypeInfo {
  std::string_view name;
  uint8_t size;
  bool floating;
};

// Index = Dtype's code.
constexpr DtypeInfo kDtypes[] = {
    {"uint8", 1, false},        {"int8", 1, false},       {"int16", 2, false},
    {"int32", 4, false},        {"int64", 8, false},      {"float16", 2, true},
    {"float32", 4, true},       {"float64", 8, true},     {"complex32", 4, true},
    {"complex64", 8, true},     {"complex128", 16, true}, {"bool", 1, false},
    {"qint8", 1, false},        {"quint8", 1, false},     {"qint32", 4, false},
    {"bfloat16", 2, true},      {"quint4x2", 1, false},   {"quint2x4", 1, false},
    {"bits1x8", 1, false},      {"bits2x4", 1, false},    {"bits4x2", 1, false},
    {"bits8", 1, false},        {"bits16", 2, false},     {"float8_e5m2", 1, true},
    {"float8_e4m3fn", 1, true},
};
static_assert(std::size(kDtypes) == size_t(Dtype::kFloat8E4m3fn) + 1, "one row per Dtype");

constexpr std::string_view kDeviceTypes[] = {
    "cpu",  "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip",
    "fpga", "ort",  "xla",    "vulkan", "metal",  "xpu",   "mps",
    "meta", "hpu",  "ve",     "lazy",   "ipu",    "mtia",  "privateuse1",
};

}  // namespace

size_t digest_length(DigestAlgo algo) {
  switch (algo) {
    case DigestAlgo::kMd5: return 16;
    case DigestAlgo::kSha256: return 32;
    case DigestAlgo::kXxh3: return 16;
    case DigestAlgo::kDevice: return 8;
  }
  return 0;
}

std::string_view digest_name(DigestAlgo algo) {
  switch (algo) {
    case DigestAlgo::kMd5: return "md5";
    case DigestAlgo::kSha256: return "sha256";
    case DigestAlgo::kXxh3: return "xxh3";
    case DigestAlgo::kDevice: return "device";
  }
  return "unknown";
}

bool parse_digest_name(std::string_view name, DigestAlgo* out) {
  for (DigestAlgo a :
       {DigestAlgo::kMd5, DigestAlgo::kSha256, DigestAlgo::kXxh3, DigestAlgo::kDevice}) {
    if (digest_name(a) == name) {
      *out = a;
      return true;
    }
  }
  return false;
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kOther: return "other";
  }
  return "other";
}

std::string_view scope_name(Scope scope) {
  switch (scope) {
    case Scope::kFunction: return "function";
    case Scope::kBackwardFunction: return "backward_function";
    case Scope::kUserScope: return "user_scope";
    case Scope::kOther: return "other";
  }
  return "other";
}

std::string_view provenance_name(Provenance p) {
  switch (p) {
    case Provenance::kOutput: return "output";
    case Provenance::kExternal: return "external";
    case Provenance::kView: return "view";
    case Provenance::kCompiled: return "compiled";
  }
  return "unknown";
}

std::string_view dtype_name(Dtype dtype) {
  const size_t i = size_t(dtype);
  return i < std::size(kDtypes) ? kDtypes[i].name : "unknown";
}
bool dtype_is_floating(Dtype dtype) {
  const size_t i = size_t(dtype);
  return i < std::size(kDtypes) && kDtypes[i].floating;
}
size_t dtype_size(Dtype dtype) {
  const size_t i = size_t(dtype);
  return i < std::size(kDtypes) ? kDtypes[i].size : 0;
}

std::string_view device_type_name(uint8_t device_type) {
  return device_type < std::size(kDeviceTypes) ? kDeviceTypes[device_type] : "unknown";
}

uint64_t TensorDesc::numel() const {
  uint64_t n = 1;
  for (int64_t s : sizes) n *= uint64_t(s);
  return n;
}

bool TensorDesc::same_digest(const TensorDesc& other) const {
  return digest_len == other.digest_len && digest == other.digest;
}

std::string TensorDesc::digest_hex() const {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < digest_len; ++i) {
    s.push_back(kHex[digest[i] >> 4]);
    s.push_back(kHex[digest[i] & 15]);
  }
  return s;
}

}  // namespace detaudit::trace
