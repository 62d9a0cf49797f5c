// The detaudit trace format: what one recorded stream (one thread of one process) holds.
//
// A trace is a concatenation of framed records, append-only, with no footer: a file cut short
// (kill -9) stays readable up to its last whole record. docs/trace-format.md is the long form.
//
//   <file>      ::= <header-record> <record>*
//   <record>    ::= <length:varint> <kind:u8> <body:byte[length-1]> <crc:u32le>
//                   ; crc = CRC-32C of kind and body
//   <kind>      ::= HEADER=1 | STRING=2 | STEP=3 | OP=4 | END=5 | SCOPE=6 | COLLECTIVE=7
//
//   HEADER body ::= "DTR" <format-version:varint> <digest-algo:u8> <rank:zvarint>
//                   <pid:varint> <process-role:str> <thread:str> <stream-flags:varint>
//                   <unix-ns:varint>                ; stream-flags: kStream* in records.h
//   STRING body ::= <utf8:str>                      ; ids count up from 0 in file order
//   STEP body   ::= <step:varint> <order:varint> <rng-cpu:u64le> <rng-cuda:u64le>
//                   <intra-op-threads:varint> <determinism-bits:varint>
//   OP body     ::= <order-delta:zvarint> <name:varint> <op-bits:u8> <depth:varint>
//                   [<seq-nr:zvarint>]              ; if op-bits has kOpHasSeqNr
//                   [<rng:u64le>]                   ; if op-bits has kOpHasRng
//                   <n-in:varint> <value>{n-in} <n-out:varint> <value>{n-out}
//                   [<n-written:varint> (<arg-name:varint string id> <value>){n-written}]
//                   ; the written section (format 8): the arguments the op may write and does
//                   ; not return (`Tensor(a!)[]` of the foreach and fused optimizers, batch
//                   ; norm's running statistics), each as it was when the op ended
//   END body    ::= <ops:varint> <tensors-hashed:varint> <bytes-hashed:varint>
//                   [<signal:varint> <ending-bits:varint> <open-op:str>]
//                   ; the tail when a signal ended the stream (format 7): kEnd* in records.h
//   SCOPE body  ::= <path:varint string id>          ; the user scopes around the OPs that
//                                                   ; follow, "outer/inner"; "" for none
//   COLLECTIVE body ::= <op-order:varint> <group:varint> <seq:varint> <group-rank:zvarint>
//                   <group-size:varint> <state:u8> <n:varint> <value>{n}
//                   ; a c10d collective's completion, after its OP record (op-order names it):
//                   ; group is the process's k-th process group by first use, seq counts that
//                   ; group's collectives from 1, state is kCollective* below, and the values
//                   ; are its receive buffers as they were on completion
//
//   <value>     ::= NONE=0
//                 | TENSOR_NEW=1 <tensor>           ; a tensor version first seen here
//                 | TENSOR_REF=2 <back:varint>      ; tensor id = next-id - back (back >= 1)
//                 | TENSOR_SKIPPED=3 <reason:varint string id>
//                 | INT=4 <zvarint> | DOUBLE=5 <f64le> | BOOL_FALSE=6 | BOOL_TRUE=7
//                 | STRING=8 <varint string id> | INT_LIST=9 <n:varint> <zvarint>{n}
//                 | DOUBLE_LIST=10 <n:varint> <f64le>{n} | BOOL_LIST=11 <n:varint> <u8>{n}
//                 | LIST=12 <n:varint> <value>{n}   ; tensor lists and other lists
//                 | DEVICE=13 <type:u8> <index:zvarint>
//                 | GENERATOR=14 <state-digest:u64le>
//                 | OTHER=15 <type-name:varint string id>
//                 | TENSOR_WRITTEN=16 <back:varint> ; as TENSOR_REF, an input the op writes in
//                                                   ; full without reading it (format 5)
//   <tensor>    ::= <dtype:u8> <device-type:u8> <device-index:zvarint> <tensor-bits:u8>
//                   ; tensor-bits: kTensor* below, provenance in bits 5-6
//                   <ndim:varint> <size:varint>{ndim} [<stride:zvarint>{ndim}]  ; unless contiguous
//                   <digest:byte[digest-len]>
//                   [<float-stats> | <int-stats>]   ; if tensor-bits has kTensorHasStats
//                   [<nan:varint> <inf:varint>]     ; if tensor-bits has kTensorHasNanInf
//                   [<base-back:varint>]            ; if provenance is VIEW: own id - base id
//   <float-stats> ::= <min:f64> <max:f64> <mean:f64> <l2:f64>
//   <int-stats>   ::= <min:zvarint> <max:zvarint> <mean:f64>
//                   ; the doubles computed, in the host-independent order of stats.cpp
//   <str>       ::= <n:varint> <byte>{n}
//
// Every TENSOR_NEW takes the next tensor id (0, 1, ...) of its stream, inputs before outputs,
// outputs before the written section.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trace/dims.h"
#include "trace/dtype.h"

namespace detaudit::trace {

inline constexpr char kMagic[3] = {'D', 'T', 'R'};
// 6: TENSOR_NEW_SHARED; 7: END by a signal; 8: the OP record's written section; 9: a sentinel's
// optimizer step as one record (is_step_state_record), not its ops; 10: an OP's depth says
// whether autograd was off (kGradOffFormat); 11: a STEP holds NumPy's and Python's generators
// (kPythonGeneratorsFormat)
inline constexpr uint32_t kFormatVersion = 11;
// The first format whose sentinel traces record a step's state: an older sentinel trace's
// records do not pair with a newer one's.
inline constexpr uint32_t kStepStateFormat = 9;
// The first format whose OP depth carries grad-off in its low bit (depth << 1 | grad-off): the op
// ran with autograd off (torch.no_grad, inference_mode). Older ops read as grad on.
inline constexpr uint32_t kGradOffFormat = 10;
// The first format whose STEP records end with the digests of NumPy's and Python's global
// generators. Older steps read them as 0: unknown.
inline constexpr uint32_t kPythonGeneratorsFormat = 11;
// Format 4 lacks only TENSOR_WRITTEN: its overwrites read as reads, which can only confirm more.
inline constexpr uint32_t kOldestReadableFormat = 4;
inline constexpr size_t kMaxRecordBytes = 64u << 20;  // a larger length is corruption
// A TENSOR_REF reaches back at most this many tensor ids, so readers keep a bounded window.
inline constexpr uint64_t kRefWindow = 1u << 16;

enum class RecordKind : uint8_t {
  kHeader = 1,
  kString = 2,
  kStep = 3,
  kOp = 4,
  kEnd = 5,
  kScope = 6,
  kCollective = 7
};

// kDevice: the device digest (src/digest/lane_digest.h), computed on the GPU for CUDA tensors.
enum class DigestAlgo : uint8_t { kMd5 = 1, kSha256 = 2, kXxh3 = 3, kDevice = 4 };
size_t digest_length(DigestAlgo algo);
std::string_view digest_name(DigestAlgo algo);
bool parse_digest_name(std::string_view name, DigestAlgo* out);

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2, kOther = 3 };
std::string_view phase_name(Phase phase);

enum class Scope : uint8_t { kFunction = 0, kBackwardFunction = 1, kUserScope = 2, kOther = 3 };
std::string_view scope_name(Scope scope);

// op-bits: phase in bits 0-1, scope in bits 2-3.
inline constexpr uint8_t kOpHasSeqNr = 1u << 4;
inline constexpr uint8_t kOpHasRng = 1u << 5;
inline constexpr uint8_t kOpIsRandom = 1u << 6;  // the op takes a Generator argument
// A torch.compile region (dynamo frame, CompiledFunction, CompiledFunctionBackward): inductor's
// kernels inside it run below the dispatcher, recorded only as the ops below.
inline constexpr uint8_t kOpCompiledRegion = 1u << 7;
// A kernel inductor generated, recorded as an op of this namespace by the interposer's Python
// side (hooks/python/): inductor_kernel::<kernel>(str origin, Tensor[] inputs) -> Tensor(a!)[].
inline constexpr std::string_view kCompiledKernelNamespace = "inductor_kernel::";
inline bool is_compiled_kernel(std::string_view op_name) {
  return op_name.substr(0, kCompiledKernelNamespace.size()) == kCompiledKernelNamespace;
}

// tensor-bits, with the provenance in bits 5-6.
inline constexpr uint8_t kTensorContiguous = 1u << 0;
inline constexpr uint8_t kTensorUninitialized = 1u << 1;  // written by the empty family only
inline constexpr uint8_t kTensorHasStats = 1u << 2;
inline constexpr uint8_t kTensorHasNanInf = 1u << 3;
inline constexpr uint8_t kTensorIntStats = 1u << 4;  // int-stats instead of float-stats
inline constexpr int kProvenanceShift = 5;
// An argument the op overwrites without reading (zero_'s self, an out= tensor): its bytes are
// not hashed and its digest is all zeros.
inline constexpr uint8_t kTensorNotRead = 1u << 7;

// Where a tensor version came from, as far as its stream can tell.
enum class Provenance : uint8_t {
  kOutput = 0,    // an output of the op that carries it
  kExternal = 1,  // first seen as an input: data loading, from_blob, another thread
  kView = 2,      // shares storage and version with an earlier tensor of the stream (base-back)
  kCompiled = 3,  // first seen after a compiled region ran in this step: likely its output
};
std::string_view provenance_name(Provenance p);

// state of a COLLECTIVE record.
inline constexpr uint8_t kCollectiveCompleted = 0;
inline constexpr uint8_t kCollectiveNotCompleted = 1;  // still pending when the stream ended
inline constexpr uint8_t kCollectiveFailed = 2;        // its future completed with an error

// determinism-bits of a STEP record.
inline constexpr uint32_t kDetAlgorithms = 1u << 0;
inline constexpr uint32_t kDetWarnOnly = 1u << 1;
inline constexpr uint32_t kDetCudnn = 1u << 2;
inline constexpr uint32_t kBenchmarkCudnn = 1u << 3;
inline constexpr uint32_t kAllowTf32Cublas = 1u << 4;
inline constexpr uint32_t kAllowTf32Cudnn = 1u << 5;

enum class ValueType : uint8_t {
  kNone = 0,
  kTensorNew = 1,
  kTensorRef = 2,
  kTensorSkipped = 3,
  kInt = 4,
  kDouble = 5,
  kBoolFalse = 6,
  kBoolTrue = 7,
  kString = 8,
  kIntList = 9,
  kDoubleList = 10,
  kBoolList = 11,
  kList = 12,
  kDevice = 13,
  kGenerator = 14,
  kOther = 15,
  kTensorWritten = 16,
  kTensorNewShared = 17,  // a TENSOR_NEW over shared memory: a sharing byte, then the tensor
};

// The sharing byte of a TENSOR_NEW_SHARED: the tensor's bytes are in shared memory
// (share_memory_(), a DataLoader batch), and whether they changed since this stream last saw
// them with no write of its own: another process wrote them.
enum class Sharing : uint8_t { kNone = 0, kSharedMemory = 1, kChangedElsewhere = 2 };

inline bool is_tensor(ValueType t) {
  return t == ValueType::kTensorNew || t == ValueType::kTensorRef || t == ValueType::kTensorWritten;
}

// The one table of dtypes (format.cpp): "float32", ..., "unknown" for a code it does not name.
std::string_view dtype_name(Dtype dtype);
bool dtype_is_floating(Dtype dtype);
size_t dtype_size(Dtype dtype);                          // 0 if unknown
std::string_view device_type_name(uint8_t device_type);  // c10::DeviceType numbering

using DigestBytes = std::array<uint8_t, 32>;

struct TensorStats {
  double min = 0, max = 0, mean = 0, l2 = 0;
  uint64_t nan = 0, inf = 0;
};

// One tensor version as recorded.
struct TensorDesc {
  Dtype dtype = Dtype::kUInt8;
  uint8_t device_type = 0;
  int32_t device_index = -1;
  uint8_t bits = 0;
  Dims sizes;
  Dims strides;  // empty when contiguous
  DigestBytes digest{};
  uint8_t digest_len = 0;
  TensorStats stats;
  int64_t base_id = -1;              // for Provenance::kView
  Sharing sharing = Sharing::kNone;  // from TENSOR_NEW_SHARED

  Provenance provenance() const { return Provenance((bits >> kProvenanceShift) & 3); }
  void set_provenance(Provenance p) {
    bits = uint8_t((bits & ~(3u << kProvenanceShift)) | (uint8_t(p) << kProvenanceShift));
  }
  bool uninitialized() const { return bits & kTensorUninitialized; }
  bool not_read() const { return bits & kTensorNotRead; }
  // Holds contents to compare: neither garbage nor geometry only (a buffer still being filled
  // may be geometry in one run and hashed in the other).
  bool has_contents() const { return !(bits & (kTensorUninitialized | kTensorNotRead)); }
  bool has_stats() const { return bits & kTensorHasStats; }
  uint64_t numel() const;
  bool same_digest(const TensorDesc& other) const;
  std::string digest_hex() const;
  // digest_hex() when the bytes were read and digested; "" otherwise.
  std::string contents_hex() const { return has_contents() && digest_len ? digest_hex() : ""; }
};

// A recorded tensor's contents_hex(); "" for none.
inline std::string contents_hex(const TensorDesc* t) { return t ? t->contents_hex() : ""; }

}  // namespace detaudit::trace
