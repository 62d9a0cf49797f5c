#include "trace/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace detaudit::trace {
namespace {

constexpr size_t kBlock = 4u << 20;

inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

TraceReader::TraceReader() = default;

TraceReader::~TraceReader() {
  if (file_) std::fclose(file_);
}

Status TraceReader::open(const std::string& path) {
  path_ = path;
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_)
    return Status::error(fmt::format("{}: cannot open trace: {}", path, std::strerror(errno)),
                         ExitCode::kBadInput);
  std::fseek(file_, 0, SEEK_END);
  file_size_ = uint64_t(std::ftell(file_));
  std::fseek(file_, 0, SEEK_SET);
  // A small trace gets a small buffer; fill() grows it for a longer record.
  buf_.resize(size_t(std::min<uint64_t>(kBlock, std::max<uint64_t>(file_size_, 64u << 10))));
  ReadResult r = next();
  if (r == ReadResult::kEof || r == ReadResult::kTruncated) {
    error_ = fmt::format("{}: offset 0: no complete header record (empty or cut-short trace)",
                         path_);
    return Status::error(error_, ExitCode::kBadInput);
  }
  if (r == ReadResult::kCorrupt) return Status::error(error_, ExitCode::kBadInput);
  if (kind_ != RecordKind::kHeader) {
    error_ = fmt::format("{}: offset 0: not a detaudit trace (first record is not a header)",
                         path_);
    return Status::error(error_, ExitCode::kBadInput);
  }
  if (header_.version < kOldestReadableFormat || header_.version > kFormatVersion) {
    // Digests of other formats are not comparable with this one's (format 2 hashes large
    // tensors as a tree of 1 MiB leaves).
    error_ = fmt::format(
        "{}: trace format {}, but this detaudit reads formats {} to {}: record "
        "the run again with this detaudit",
        path_, header_.version, kOldestReadableFormat, kFormatVersion);
    return Status::error(error_, ExitCode::kBadInput);
  }
  return Status();
}

bool TraceReader::fill(size_t need) {
  if (buf_len_ - buf_pos_ >= need) return true;
  if (buf_pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + buf_pos_, buf_len_ - buf_pos_);
    buf_len_ -= buf_pos_;
    buf_pos_ = 0;
  }
  if (need > buf_.size()) buf_.resize(need);
  while (buf_len_ < need && !eof_) {
    size_t n = std::fread(buf_.data() + buf_len_, 1, buf_.size() - buf_len_, file_);
    if (n == 0) eof_ = true;
    buf_len_ += n;
  }
  return buf_len_ - buf_pos_ >= need;
}

ReadResult TraceReader::fail(ReadResult r, uint64_t offset, const std::string& why) {
  result_ = r;
  error_ = fmt::format("{}: offset {}: {}", path_, offset, why);
  return r;
}

ReadResult TraceReader::next() { return read(&op_); }

ReadResult TraceReader::next_into(OpRecord* op) { return read(op); }

ReadResult TraceReader::read(OpRecord* op) {
  if (result_ != ReadResult::kRecord) return result_;
  record_offset_ = file_offset_;
  fill(10);
  if (buf_len_ == buf_pos_) return result_ = ReadResult::kEof;

  // The length varint.
  uint64_t length = 0;
  size_t n = 0;
  for (int shift = 0;; shift += 7) {
    if (buf_pos_ + n >= buf_len_)
      return fail(ReadResult::kTruncated, record_offset_, "the file ends inside a record length");
    uint8_t b = buf_[buf_pos_ + n++];
    length |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
    if (shift > 56) return fail(ReadResult::kCorrupt, record_offset_, "bad record length");
  }
  if (length == 0 || length > kMaxRecordBytes)
    return fail(ReadResult::kCorrupt, record_offset_,
                fmt::format("bad record length {} (corrupt bytes)", length));
  if (!fill(n + length + 4))
    return fail(ReadResult::kTruncated, record_offset_,
                fmt::format("the file ends inside a record of {} bytes (cut short)", length));

  const uint8_t* body = buf_.data() + buf_pos_ + n;
  uint32_t stored;
  std::memcpy(&stored, body + length, 4);
  if (crc32c(0, body, length) != stored)
    return fail(ReadResult::kCorrupt, record_offset_, "checksum mismatch (corrupt bytes)");

  ByteReader r(body, length);
  buf_pos_ += n + length + 4;
  file_offset_ += n + length + 4;
  op->name = UINT32_MAX;
  if (!decode(r, op) || r.failed()) {
    std::string what = fmt::format("undecodable record of kind {}", int(kind_));
    if (kind_ == RecordKind::kOp && op->name < strings_.size())
      what += fmt::format(" (op {})", strings_[op->name]);
    return fail(ReadResult::kCorrupt, record_offset_, what);
  }
  return result_ = ReadResult::kRecord;
}

bool TraceReader::decode(ByteReader& r, OpRecord* op) {
  kind_ = RecordKind(r.u8());
  switch (kind_) {
    case RecordKind::kHeader: {
      char magic[3] = {};
      r.raw(magic, 3);
      if (std::memcmp(magic, kMagic, 3) != 0) return false;
      header_.version = uint32_t(r.varint());
      header_.algo = DigestAlgo(r.u8());
      digest_len_ = digest_length(header_.algo);
      if (digest_len_ == 0) return false;
      header_.rank = r.zvarint();
      header_.pid = r.varint();
      header_.process_role = std::string(r.str());
      header_.thread = std::string(r.str());
      header_.flags = r.varint();
      header_.unix_ns = r.varint();
      return true;
    }
    case RecordKind::kString: strings_.emplace_back(r.str()); return true;
    case RecordKind::kStep:
      step_.step = r.varint();
      step_.order = r.varint();
      step_.rng_cpu = r.u64();
      step_.rng_cuda = r.u64();
      step_.intra_op_threads = r.varint();
      step_.determinism_bits = uint32_t(r.varint());
      if (header_.version >= kPythonGeneratorsFormat) {
        step_.rng_numpy = r.u64();
        step_.rng_python = r.u64();
      }
      if (steps_.size() < 1000000) steps_.push_back(step_);
      return true;
    case RecordKind::kOp: return decode_op(r, op);
    case RecordKind::kScope:
      scope_path_ = uint32_t(r.varint());
      return scope_path_ < strings_.size();
    case RecordKind::kCollective: {
      CollectiveRecord& c = collective_;
      c.info.op_order = r.varint();
      c.info.group = r.varint();
      c.info.seq = r.varint();
      c.info.group_rank = r.zvarint();
      c.info.group_size = r.varint();
      c.info.state = r.u8();
      c.values.clear();
      c.tensors.clear();
      uint64_t n = r.varint(), ignored = 0;
      if (n > r.remaining()) return false;
      for (uint64_t i = 0; i < n; ++i)
        if (!decode_values(r, &c.values, &c.tensors, &ignored, 0)) return false;
      return !r.failed();
    }
    case RecordKind::kEnd:
      end_.ops = r.varint();
      end_.tensors_hashed = r.varint();
      end_.bytes_hashed = r.varint();
      if (r.remaining() > 0) {  // format 7: a signal ended the stream
        end_.signal = int(r.varint());
        end_.ending_bits = r.varint();
        end_.open_op = std::string(r.str());
      }
      saw_end_ = true;
      return !r.failed();
  }
  return false;
}

std::string written_argument(const OpRecord& op, const TraceReader& reader, size_t i) {
  if (!op.output_is_written_arg(i)) return "";
  size_t k = i - op.returned_tensors;
  for (const OpRecord::WrittenArg& arg : op.written_args) {
    if (k < arg.tensors) {
      std::string name(reader.string(arg.name));
      return arg.list ? fmt::format("{}[{}]", name, k) : name;
    }
    k -= arg.tensors;
  }
  return "";
}

bool TraceReader::decode_op(ByteReader& r, OpRecord* out) {
  OpRecord& op = *out;
  op.offset = record_offset_;
  op.order = last_order_ + uint64_t(r.zvarint());
  last_order_ = op.order;
  op.step = step_.step;
  op.scope_path = scope_path_;
  op.name = uint32_t(r.varint());
  op.bits = r.u8();
  op.phase = Phase(op.bits & 3);
  op.scope = Scope((op.bits >> 2) & 3);
  const uint64_t depth = r.varint();
  const bool grad_bit = header_.version >= kGradOffFormat;
  op.depth = uint32_t(grad_bit ? depth >> 1 : depth);
  op.grad_off = grad_bit && (depth & 1);
  op.seq_nr = op.has_seq_nr() ? r.zvarint() : -1;
  op.rng = op.has_rng() ? r.u64() : 0;
  op.inputs.clear();
  op.outputs.clear();
  op.input_tensors.clear();
  op.output_tensors.clear();
  op.args_hash = 0;
  uint64_t n_in = r.varint();
  if (n_in > r.remaining()) return false;
  for (uint64_t i = 0; i < n_in; ++i)
    if (!decode_values(r, &op.inputs, &op.input_tensors, &op.args_hash, 0)) return false;
  op.written_inputs = 0;
  for (size_t i = 0, k = 0; i < op.inputs.size() && k < 64; ++i) {
    if (!is_tensor(op.inputs[i].type)) continue;
    if (op.inputs[i].type == ValueType::kTensorWritten) op.written_inputs |= uint64_t(1) << k;
    ++k;
  }
  uint64_t n_out = r.varint();
  if (n_out > r.remaining()) return false;
  op.results_hash = 0;
  for (uint64_t i = 0; i < n_out; ++i)
    if (!decode_values(r, &op.outputs, &op.output_tensors, &op.results_hash, 0)) return false;
  op.returned_tensors = op.output_tensors.size();
  op.returned_values = op.outputs.size();
  op.written_args.clear();
  if (r.remaining() > 0) {  // format 8: the written section
    uint64_t n_written = r.varint();
    if (n_written > r.remaining()) return false;
    for (uint64_t i = 0; i < n_written; ++i) {
      OpRecord::WrittenArg arg;
      arg.name = uint32_t(r.varint());
      if (arg.name >= strings_.size()) return false;
      const size_t before = op.output_tensors.size(), values_before = op.outputs.size();
      uint64_t ignored = 0;
      if (!decode_values(r, &op.outputs, &op.output_tensors, &ignored, 0)) return false;
      arg.tensors = uint32_t(op.output_tensors.size() - before);
      arg.list = op.outputs[values_before].type == ValueType::kList;
      op.written_args.push_back(arg);
    }
  }
  if (op.name >= strings_.size()) return false;
  return !r.failed();
}

bool TraceReader::decode_values(ByteReader& r, std::vector<Value>* values,
                                std::vector<int64_t>* tensors, uint64_t* args_hash, int depth) {
  if (depth > 8 || r.failed()) return false;
  Value v;
  v.type = ValueType(r.u8());
  uint64_t h = uint64_t(v.type);
  switch (v.type) {
    case ValueType::kNone:
    case ValueType::kBoolFalse:
    case ValueType::kBoolTrue: break;
    case ValueType::kTensorNew:
    case ValueType::kTensorNewShared: {
      const uint8_t sharing = v.type == ValueType::kTensorNewShared ? r.u8() : 0;
      if (sharing > uint8_t(Sharing::kChangedElsewhere)) return false;
      v.type = ValueType::kTensorNew;
      v.tensor_id = next_tensor_id_;
      size_t slot = size_t(next_tensor_id_ % int64_t(kRefWindow));
      // The window fills up as tensors come: a short trace does not pay for kRefWindow of them.
      if (slot == window_.size()) window_.emplace_back();
      TensorDesc& t = window_[slot];
      ++next_tensor_id_;
      if (!decode_tensor(r, &t)) return false;
      t.sharing = Sharing(sharing);
      tensors->push_back(v.tensor_id);
      h = uint64_t(ValueType::kTensorRef);  // new or seen before: the same argument shape
      break;
    }
    case ValueType::kTensorRef:
    case ValueType::kTensorWritten: {
      h = uint64_t(ValueType::kTensorRef);  // read or overwritten: the same argument shape
      uint64_t back = r.varint();
      if (back == 0 || back > uint64_t(next_tensor_id_) || back > kRefWindow) return false;
      v.tensor_id = next_tensor_id_ - int64_t(back);
      tensors->push_back(v.tensor_id);
      break;
    }
    case ValueType::kTensorSkipped:
    case ValueType::kString:
    case ValueType::kOther:
      v.i = int64_t(r.varint());
      if (uint64_t(v.i) >= strings_.size()) return false;
      h = mix(h, hash_bytes(strings_[size_t(v.i)]));
      break;
    case ValueType::kInt:
      v.i = r.zvarint();
      h = mix(h, uint64_t(v.i));
      break;
    case ValueType::kDouble: {
      v.d = r.f64();
      uint64_t bits;
      std::memcpy(&bits, &v.d, 8);
      h = mix(h, bits);
      break;
    }
    case ValueType::kDevice:
      v.u = r.u8();
      v.i = r.zvarint();
      h = mix(mix(h, v.u), uint64_t(v.i));
      break;
    case ValueType::kGenerator:
      v.u = r.u64();
      break;  // its state is compared as RNG state, not as an argument
    case ValueType::kIntList:
    case ValueType::kDoubleList:
    case ValueType::kBoolList: {
      v.count = r.varint();
      if (v.count > r.remaining()) return false;
      values->push_back(v);
      *args_hash = mix(*args_hash, mix(h, v.count));
      for (uint64_t i = 0; i < v.count; ++i) {
        Value e;
        if (v.type == ValueType::kIntList) {
          e.type = ValueType::kInt;
          e.i = r.zvarint();
          *args_hash = mix(*args_hash, uint64_t(e.i));
        } else if (v.type == ValueType::kDoubleList) {
          e.type = ValueType::kDouble;
          e.d = r.f64();
          uint64_t bits;
          std::memcpy(&bits, &e.d, 8);
          *args_hash = mix(*args_hash, bits);
        } else {
          e.type = r.u8() ? ValueType::kBoolTrue : ValueType::kBoolFalse;
          *args_hash = mix(*args_hash, uint64_t(e.type));
        }
        values->push_back(e);
      }
      return !r.failed();
    }
    case ValueType::kList: {
      v.count = r.varint();
      if (v.count > r.remaining()) return false;
      values->push_back(v);
      *args_hash = mix(*args_hash, mix(h, v.count));
      for (uint64_t i = 0; i < v.count; ++i)
        if (!decode_values(r, values, tensors, args_hash, depth + 1)) return false;
      return !r.failed();
    }
    default: return false;
  }
  values->push_back(v);
  *args_hash = mix(*args_hash, h);
  return !r.failed();
}

bool TraceReader::decode_tensor(ByteReader& r, TensorDesc* t) {
  t->dtype = Dtype(r.u8());
  t->device_type = r.u8();
  t->device_index = int32_t(r.zvarint());
  t->bits = r.u8();
  uint64_t ndim = r.varint();
  if (ndim > 64) return false;
  t->sizes.resize(ndim);
  for (auto& s : t->sizes) s = int64_t(r.varint());
  t->strides.clear();
  if (!(t->bits & kTensorContiguous)) {
    t->strides.resize(ndim);
    for (auto& s : t->strides) s = r.zvarint();
  }
  t->digest_len = uint8_t(digest_len_);
  t->digest.fill(0);
  r.raw(t->digest.data(), digest_len_);
  t->stats = TensorStats{};
  if (t->bits & kTensorHasStats) {
    if (t->bits & kTensorIntStats) {
      t->stats.min = double(r.zvarint());
      t->stats.max = double(r.zvarint());
      t->stats.mean = r.f64();
    } else {
      t->stats.min = r.f64();
      t->stats.max = r.f64();
      t->stats.mean = r.f64();
      t->stats.l2 = r.f64();
    }
  }
  if (t->bits & kTensorHasNanInf) {
    t->stats.nan = r.varint();
    t->stats.inf = r.varint();
  }
  t->base_id = -1;
  if (t->provenance() == Provenance::kView) {
    uint64_t back = r.varint();
    if (back == 0 || back > uint64_t(next_tensor_id_)) return false;
    t->base_id = next_tensor_id_ - 1 - int64_t(back);
  }
  return !r.failed();
}

std::string_view TraceReader::string(uint64_t id) const {
  return id < strings_.size() ? std::string_view(strings_[size_t(id)]) : std::string_view("?");
}

const TensorDesc* TraceReader::tensor(int64_t id) const {
  if (id < 0 || id >= next_tensor_id_ || id < next_tensor_id_ - int64_t(kRefWindow)) return nullptr;
  return &window_[size_t(id % int64_t(kRefWindow))];
}

}  // namespace detaudit::trace
