#include "trace/records.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

namespace detaudit::trace {

namespace {
// The "/"-separated component of a scope path that is the label, as [begin, end).
std::pair<size_t, size_t> label_span(std::string_view path) {
  for (size_t begin = 0; begin < path.size();) {
    size_t end = path.find('/', begin);
    if (end == std::string_view::npos) end = path.size();
    if (path.substr(begin, kOptimizerStepLabel.size()) == kOptimizerStepLabel) return {begin, end};
    begin = end + 1;
  }
  return {std::string_view::npos, std::string_view::npos};
}

// Digits only, all of s (from_chars takes no sign or space for an unsigned).
bool parse_count(std::string_view s, uint64_t* out) {
  const char* end = s.data() + s.size();
  auto [at, error] = std::from_chars(s.data(), end, *out);
  return !s.empty() && error == std::errc() && at == end;
}
}  // namespace

std::optional<OptimizerStepLabel> find_optimizer_step_label(std::string_view scope_path) {
  auto [begin, end] = label_span(scope_path);
  if (begin == std::string_view::npos) return std::nullopt;
  std::string_view rest = scope_path.substr(begin + kOptimizerStepLabel.size(),
                                            end - begin - kOptimizerStepLabel.size());
  const size_t first = rest.find(' '), last = rest.rfind(' ');
  if (first == std::string_view::npos || last == first) return std::nullopt;
  OptimizerStepLabel label;
  label.optimizer = std::string(rest.substr(first + 1, last - first - 1));
  if (!parse_count(rest.substr(0, first), &label.ordinal) || label.ordinal == 0 ||
      label.optimizer.empty() || !parse_count(rest.substr(last + 1), &label.tensors))
    return std::nullopt;
  return label;
}

std::string without_optimizer_step_label(std::string_view scope_path) {
  auto [begin, end] = label_span(scope_path);
  if (begin == std::string_view::npos) return std::string(scope_path);
  std::string out(scope_path.substr(0, begin));
  if (end < scope_path.size()) out += scope_path.substr(end + 1);
  if (!out.empty() && out.back() == '/') out.pop_back();
  return out;
}

void frame_record(std::string_view kind_and_body, std::string* out) {
  ByteWriter w(out);
  w.varint(kind_and_body.size());
  w.raw(kind_and_body.data(), kind_and_body.size());
  w.u32(crc32c(0, kind_and_body.data(), kind_and_body.size()));
}

void RecordEncoder::finish(std::string* out) { frame_record(scratch_, out); }

void RecordEncoder::header(const StreamHeader& h, std::string* out) {
  ByteWriter& w = begin(RecordKind::kHeader);
  w.raw(kMagic, sizeof kMagic);
  w.varint(h.version);
  w.u8(uint8_t(h.algo));
  w.zvarint(h.rank);
  w.varint(h.pid);
  w.str(h.process_role);
  w.str(h.thread);
  w.varint(h.flags);
  w.varint(h.unix_ns);
  finish(out);
}

void RecordEncoder::string(std::string_view s, std::string* out) {
  begin(RecordKind::kString).str(s);
  finish(out);
}

void RecordEncoder::step(const StepInfo& s, std::string* out) {
  ByteWriter& w = begin(RecordKind::kStep);
  w.varint(s.step);
  w.varint(s.order);
  w.u64(s.rng_cpu);
  w.u64(s.rng_cuda);
  w.varint(s.intra_op_threads);
  w.varint(s.determinism_bits);
  w.u64(s.rng_numpy);
  w.u64(s.rng_python);
  finish(out);
}

void RecordEncoder::scope(uint32_t path, std::string* out) {
  begin(RecordKind::kScope).varint(path);
  finish(out);
}

ByteWriter& RecordEncoder::begin_op(const OpHead& head) {
  ByteWriter& w = begin(RecordKind::kOp);
  w.zvarint(int64_t(head.order - head.previous_order));
  w.varint(head.name_id);
  w.u8(head.bits);
  w.varint(uint64_t(head.depth) << 1 | uint64_t(head.grad_off));
  if (head.bits & kOpHasSeqNr) w.zvarint(head.seq_nr);
  if (head.bits & kOpHasRng) w.u64(head.rng);
  return w;
}

ByteWriter& RecordEncoder::begin_collective(const CollectiveInfo& c) {
  ByteWriter& w = begin(RecordKind::kCollective);
  w.varint(c.op_order);
  w.varint(c.group);
  w.varint(c.seq);
  w.zvarint(c.group_rank);
  w.varint(c.group_size);
  w.u8(c.state);
  return w;
}

void RecordEncoder::end(const EndInfo& e, std::string* out) {
  char buf[kMaxEndRecordBytes];
  out->append(buf, encode_end(e, buf));
}

size_t encode_end(const EndInfo& e, char* buf) {
  // Body first, after room for the length: kind, three counts, the signal's tail.
  constexpr size_t kLengthRoom = 2;  // a body under 128 * 128 bytes
  char* body = buf + kLengthRoom;
  SpanWriter w(body);
  w.u8(uint8_t(RecordKind::kEnd));
  w.varint(e.ops);
  w.varint(e.tensors_hashed);
  w.varint(e.bytes_hashed);
  if (e.signal != 0) {
    w.varint(uint64_t(e.signal));
    w.varint(e.ending_bits);
    const size_t n = std::min<size_t>(e.open_op.size(), 160);
    w.varint(n);
    w.raw(e.open_op.data(), n);
  }
  const size_t body_size = w.size();
  SpanWriter head(buf);
  head.varint(body_size);
  // Close up the gap a one-byte length leaves.
  if (head.size() < kLengthRoom) std::memmove(buf + head.size(), body, body_size);
  char* crc_at = buf + head.size() + body_size;
  const uint32_t crc = crc32c(0, buf + head.size(), body_size);
  std::memcpy(crc_at, &crc, 4);
  return head.size() + body_size + 4;
}

namespace {

template <typename Writer>
void write_tensor_to(Writer& w, const TensorDesc& t, uint64_t base_back) {
  w.u8(uint8_t(t.dtype));
  w.u8(t.device_type);
  w.zvarint(t.device_index);
  w.u8(t.bits);
  w.varint(t.sizes.size());
  for (int64_t s : t.sizes) w.varint(uint64_t(s));
  if (!(t.bits & kTensorContiguous))
    for (int64_t s : t.strides) w.zvarint(s);
  w.raw(t.digest.data(), t.digest_len);
  if (t.bits & kTensorHasStats) {
    if (t.bits & kTensorIntStats) {
      w.zvarint(int64_t(t.stats.min));
      w.zvarint(int64_t(t.stats.max));
      w.f64(t.stats.mean);
    } else {
      // The doubles the digester computed: the tolerance gate compares these, not a rounding.
      w.f64(t.stats.min);
      w.f64(t.stats.max);
      w.f64(t.stats.mean);
      w.f64(t.stats.l2);
    }
  }
  if (t.bits & kTensorHasNanInf) {
    w.varint(t.stats.nan);
    w.varint(t.stats.inf);
  }
  if (t.provenance() == Provenance::kView) w.varint(base_back);
}

// The most a tensor of up to Dims::kInline dimensions takes: the fixed bytes, two varints per
// dimension, a digest, four statistics, two counts and a base.
constexpr size_t kMaxInlineTensorBytes = 3 + 10 + 10 + 2 * 10 * Dims::kInline + 32 + 32 + 20 + 10;

}  // namespace

void write_tensor(ByteWriter& w, const TensorDesc& t, uint64_t base_back) {
  if (t.sizes.size() > Dims::kInline || t.strides.size() > Dims::kInline) {
    write_tensor_to(w, t, base_back);
    return;
  }
  char buf[kMaxInlineTensorBytes];
  SpanWriter span(buf);
  write_tensor_to(span, t, base_back);
  w.raw(buf, span.size());
}

}  // namespace detaudit::trace
