// The trace format round-trips, and a cut-short or corrupted file is reported, never misread.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "digest/digest.h"
#include "digest/md5_batch.h"
#include "digest/md5_lanes.h"
#include "digest/strided.h"
#include "digest/xxh3_wide.h"
#include "strided_reference.h"
#include "trace/reader.h"
#include "trace/records.h"

namespace detaudit::trace {
namespace {

std::string temp_path(const char* name) { return std::string(::testing::TempDir()) + "/" + name; }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TensorDesc sample_tensor(uint8_t fill) {
  TensorDesc t;
  t.dtype = Dtype::kFloat32;
  t.bits = kTensorContiguous | kTensorHasStats;
  t.sizes = {2, 3};
  t.digest_len = 16;
  t.digest.fill(fill);
  t.stats.min = -1;
  t.stats.max = 2;
  t.stats.mean = 0.5;
  t.stats.l2 = 3;
  return t;
}

// Writes: header, one string, one step, one op with a new input, a new output and a ref.
std::string sample_trace() {
  std::string out;
  RecordEncoder enc;
  StreamHeader h;
  h.rank = 1;
  h.pid = 42;
  enc.header(h, &out);
  enc.string("aten::add", &out);
  StepInfo s;
  s.step = 3;
  s.order = 10;
  enc.step(s, &out);
  ByteWriter& w = enc.begin(RecordKind::kOp);
  w.zvarint(10);  // order delta
  w.varint(0);    // name id
  w.u8(uint8_t(Phase::kBackward) | kOpHasSeqNr);
  w.varint(0);
  w.zvarint(7);
  w.varint(3);  // three inputs: new tensor, ref to it, an int
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(0xab), 0);
  w.u8(uint8_t(ValueType::kTensorRef));
  w.varint(1);
  w.u8(uint8_t(ValueType::kInt));
  w.zvarint(-5);
  w.varint(1);
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(0xcd), 0);
  enc.finish(&out);
  return out;
}

TEST(TraceTest, RoundTripsEveryField) {
  std::string path = temp_path("roundtrip.dtr");
  write_file(path, sample_trace());
  TraceReader r;
  ASSERT_TRUE(r.open(path).ok()) << r.error();
  EXPECT_EQ(r.header().rank, 1);
  EXPECT_EQ(r.header().pid, 42u);
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  EXPECT_EQ(r.kind(), RecordKind::kString);
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  EXPECT_EQ(r.step().step, 3u);
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  const OpRecord& op = r.op();
  EXPECT_EQ(r.string(op.name), "aten::add");
  EXPECT_EQ(op.order, 10u);
  EXPECT_EQ(op.step, 3u);
  EXPECT_EQ(op.phase, Phase::kBackward);
  EXPECT_EQ(op.seq_nr, 7);
  ASSERT_EQ(op.input_tensors.size(), 2u);
  EXPECT_EQ(op.input_tensors[0], 0);
  EXPECT_EQ(op.input_tensors[1], 0);
  ASSERT_EQ(op.output_tensors.size(), 1u);
  const TensorDesc* out = r.tensor(op.output_tensors[0]);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->digest[0], 0xcd);
  EXPECT_EQ(out->sizes.to_vector(), (std::vector<int64_t>{2, 3}));
  EXPECT_FLOAT_EQ(out->stats.mean, 0.5);
  EXPECT_EQ(r.next(), ReadResult::kEof);
}

// Tensors of up to Dims::kInline dimensions are encoded into a stack buffer, larger ones straight
// into the record: both read back field for field.
TEST(TraceTest, TensorsOfEveryRankRoundTrip) {
  std::vector<TensorDesc> tensors;
  for (size_t rank : {size_t(0), size_t(2), Dims::kInline, Dims::kInline + 1, size_t(9)}) {
    TensorDesc t;
    t.dtype = rank % 2 ? Dtype::kInt64 : Dtype::kFloat32;  // integer statistics, or float
    t.device_type = 1;
    t.device_index = int32_t(rank) - 1;
    t.bits = kTensorHasStats | kTensorHasNanInf | (rank % 2 ? kTensorIntStats : 0);
    std::vector<int64_t> sizes, strides;
    for (size_t d = 0; d < rank; ++d) {
      sizes.push_back(int64_t(d + 2) * 300);
      strides.push_back(d % 2 ? -int64_t(d) * 70000 : int64_t(d));
    }
    t.sizes.assign(sizes.begin(), sizes.end());
    t.strides.assign(strides.begin(), strides.end());
    if (rank == 0) t.bits |= kTensorContiguous;
    t.digest_len = 32;
    for (size_t i = 0; i < 32; ++i) t.digest[i] = uint8_t(i * 7 + rank);
    t.stats = {rank % 2 ? -5.0 : -1.25, rank % 2 ? 1e6 : 2.5, 0.125, 3.5, 7, 300};
    tensors.push_back(t);
  }
  std::string out;
  RecordEncoder enc;
  StreamHeader header;
  header.algo = DigestAlgo::kSha256;  // 32-byte digests
  enc.header(header, &out);
  enc.string("aten::op", &out);
  enc.step(StepInfo{}, &out);
  ByteWriter& w = enc.begin(RecordKind::kOp);
  w.zvarint(1);
  w.varint(0);
  w.u8(uint8_t(Phase::kForward));
  w.varint(0);
  w.varint(tensors.size());
  for (const TensorDesc& t : tensors) {
    w.u8(uint8_t(ValueType::kTensorNew));
    write_tensor(w, t, 0);
  }
  w.varint(0);
  enc.finish(&out);
  const std::string path = temp_path("ranks.dtr");
  write_file(path, out);
  TraceReader r;
  ASSERT_TRUE(r.open(path).ok()) << r.error();
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  ASSERT_EQ(r.next(), ReadResult::kRecord) << r.error();
  ASSERT_EQ(r.op().input_tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& want = tensors[i];
    const TensorDesc* got = r.tensor(r.op().input_tensors[i]);
    ASSERT_NE(got, nullptr) << i;
    EXPECT_EQ(got->sizes.to_vector(), want.sizes.to_vector()) << i;
    if (!(want.bits & kTensorContiguous)) {
      EXPECT_EQ(got->strides.to_vector(), want.strides.to_vector()) << i;
    }
    EXPECT_EQ(got->device_index, want.device_index) << i;
    EXPECT_TRUE(got->same_digest(want)) << i;
    EXPECT_EQ(got->stats.min, want.stats.min) << i;
    EXPECT_EQ(got->stats.max, want.stats.max) << i;
    EXPECT_EQ(got->stats.mean, want.stats.mean) << i;
    if (!(want.bits & kTensorIntStats)) {
      EXPECT_EQ(got->stats.l2, want.stats.l2) << i;
    }
    EXPECT_EQ(got->stats.nan, want.stats.nan) << i;
    EXPECT_EQ(got->stats.inf, want.stats.inf) << i;
  }
}

TEST(TraceTest, EveryCutReadsCleanlyUpToTheLastWholeRecord) {
  std::string bytes = sample_trace();
  std::string path = temp_path("cut.dtr");
  for (size_t cut = 12; cut < bytes.size(); ++cut) {
    write_file(path, bytes.substr(0, cut));
    TraceReader r;
    if (!r.open(path).ok()) continue;  // cut inside the header: an error, not a misread
    ReadResult res;
    while ((res = r.next()) == ReadResult::kRecord) {
    }
    EXPECT_TRUE(res == ReadResult::kTruncated || res == ReadResult::kEof) << cut;
    if (res == ReadResult::kTruncated) {
      EXPECT_NE(r.error().find("offset"), std::string::npos);
    }
  }
}

// A clean END, and the END a signal's save writes with its tail (format 7), read back; the tail
// is encoded without allocation, into a fixed buffer, the op's name cut to fit.
TEST(TraceTest, EndRecordsOfAnExitAndOfASignalRoundTrip) {
  EndInfo clean;
  clean.ops = 3;
  clean.tensors_hashed = 2;
  clean.bytes_hashed = 300;
  EndInfo killed = clean;
  killed.signal = 6;
  killed.ending_bits = kEndExiting | kEndInsideOp | kEndThreadKnown;
  killed.open_op = "aten::index_put_";
  EndInfo long_name = killed;
  long_name.open_op = std::string(1000, 'x');
  for (const EndInfo& e : {clean, killed, long_name}) {
    std::string bytes = sample_trace();
    RecordEncoder enc;
    enc.end(e, &bytes);
    char buf[kMaxEndRecordBytes];
    const size_t n = encode_end(e, buf);
    ASSERT_LE(n, kMaxEndRecordBytes);
    EXPECT_EQ(bytes.substr(bytes.size() - n), std::string(buf, n));  // one encoding, two ways
    const std::string path = temp_path("end.dtr");
    write_file(path, bytes);
    TraceReader r;
    ASSERT_TRUE(r.open(path).ok()) << r.error();
    ReadResult res;
    while ((res = r.next()) == ReadResult::kRecord) {
    }
    EXPECT_EQ(res, ReadResult::kEof);
    ASSERT_TRUE(r.saw_end());
    EXPECT_EQ(r.end_info().ops, 3u);
    EXPECT_EQ(r.end_info().bytes_hashed, 300u);
    EXPECT_EQ(r.end_info().signal, e.signal);
    EXPECT_EQ(r.end_info().ending_bits, e.ending_bits);
    EXPECT_EQ(r.end_info().open_op, e.open_op.substr(0, 160));
  }
}

TEST(TraceTest, CorruptByteNamesFileAndOffset) {
  std::string bytes = sample_trace();
  bytes[bytes.size() - 10] ^= 0x40;  // inside the op record
  std::string path = temp_path("corrupt.dtr");
  write_file(path, bytes);
  TraceReader r;
  ASSERT_TRUE(r.open(path).ok());
  ReadResult res;
  while ((res = r.next()) == ReadResult::kRecord) {
  }
  ASSERT_EQ(res, ReadResult::kCorrupt);
  EXPECT_NE(r.error().find(path), std::string::npos);
  EXPECT_NE(r.error().find("checksum"), std::string::npos);
}

// Format 1 digests large tensors differently: comparing it with format 2 would invent divergences.
TEST(TraceTest, AnotherFormatVersionIsRejectedAtOpenWithWhatToDo) {
  std::string out;
  RecordEncoder enc;
  StreamHeader h;
  h.version = 1;
  enc.header(h, &out);
  std::string path = temp_path("format1.dtr");
  write_file(path, out);
  TraceReader r;
  Status s = r.open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kBadInput);
  EXPECT_NE(s.message().find("trace format 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("record the run again"), std::string::npos) << s.message();
}

// An OP's depth carries whether autograd was off (format 10); an older trace's depth is its own.
TEST(TraceTest, AnOpsDepthSaysWhetherAutogradWasOffAndOlderDepthsReadWhole) {
  for (uint32_t version : {kFormatVersion, kGradOffFormat - 1}) {
    std::string out;
    RecordEncoder enc;
    StreamHeader h;
    h.version = version;
    enc.header(h, &out);
    enc.string("aten::linear", &out);
    for (bool grad_off : {false, true}) {
      OpHead head;
      head.depth = 3;
      head.grad_off = grad_off && version >= kGradOffFormat;
      ByteWriter& w = version >= kGradOffFormat ? enc.begin_op(head) : enc.begin(RecordKind::kOp);
      if (version < kGradOffFormat) {  // the head as format 9 wrote it
        w.zvarint(0);
        w.varint(0);
        w.u8(0);
        w.varint(3);
      }
      w.varint(0);
      w.varint(0);
      enc.finish(&out);
    }
    std::string path = temp_path("grad_off.dtr");
    write_file(path, out);
    TraceReader r;
    ASSERT_TRUE(r.open(path).ok()) << r.error();
    ASSERT_EQ(r.next(), ReadResult::kRecord);
    for (bool grad_off : {false, true}) {
      ASSERT_EQ(r.next(), ReadResult::kRecord) << r.error();
      EXPECT_EQ(r.op().depth, 3u) << version;
      EXPECT_EQ(r.op().grad_off, grad_off && version >= kGradOffFormat) << version;
    }
  }
}

// An overwritten input is a reference that says so, and format 4, which had none, still reads.
// A STEP carries NumPy's and Python's generators from format 11; an older one's read as unknown.
TEST(TraceTest, AStepHoldsEachGeneratorAndOlderStepsReadTheirsAsUnknown) {
  for (uint32_t version : {kFormatVersion, kPythonGeneratorsFormat - 1}) {
    std::string out;
    RecordEncoder enc;
    StreamHeader h;
    h.version = version;
    enc.header(h, &out);
    ByteWriter& w = enc.begin(RecordKind::kStep);
    for (uint64_t field : {4, 40}) w.varint(field);  // step, order
    w.u64(0x1111);                                   // torch's CPU generator
    w.u64(0);                                        // CUDA's
    for (uint64_t field : {2, 1}) w.varint(field);   // threads, determinism bits
    if (version >= kPythonGeneratorsFormat) {
      w.u64(0xabcd);  // NumPy's
      w.u64(0x1234);  // Python's
    }
    enc.finish(&out);
    std::string path = temp_path("python_generators.dtr");
    write_file(path, out);
    TraceReader r;
    ASSERT_TRUE(r.open(path).ok()) << r.error();
    ASSERT_EQ(r.next(), ReadResult::kRecord) << r.error();
    const bool noted = version >= kPythonGeneratorsFormat;
    EXPECT_EQ(r.step().step, 4u);
    EXPECT_EQ(r.step().rng_cpu, 0x1111u);
    EXPECT_EQ(r.step().determinism_bits, 1u);
    EXPECT_EQ(r.step().rng_numpy, noted ? 0xabcdu : 0u) << version;
    EXPECT_EQ(r.step().rng_python, noted ? 0x1234u : 0u) << version;
    EXPECT_EQ(r.next(), ReadResult::kEof) << r.error();
  }
  // The encoder writes them.
  std::string out;
  RecordEncoder enc;
  enc.header(StreamHeader{}, &out);
  StepInfo s;
  s.rng_numpy = 7;
  s.rng_python = 9;
  enc.step(s, &out);
  std::string path = temp_path("python_generators_encoded.dtr");
  write_file(path, out);
  TraceReader r;
  ASSERT_TRUE(r.open(path).ok()) << r.error();
  ASSERT_EQ(r.next(), ReadResult::kRecord);
  EXPECT_EQ(r.step().rng_numpy, 7u);
  EXPECT_EQ(r.step().rng_python, 9u);
}

TEST(TraceTest, WrittenInputsAreMarkedAndFormat4StillReads) {
  for (uint32_t version : {kFormatVersion, kOldestReadableFormat}) {
    std::string out;
    RecordEncoder enc;
    StreamHeader h;
    h.version = version;
    enc.header(h, &out);
    enc.string("aten::mul", &out);
    ByteWriter& w = enc.begin(RecordKind::kOp);
    w.zvarint(0);
    w.varint(0);
    w.u8(0);
    w.varint(0);
    w.varint(3);  // a, b, out=: a new tensor, a reference to it, then it written in full
    w.u8(uint8_t(ValueType::kTensorNew));
    write_tensor(w, sample_tensor(1), 0);
    w.u8(uint8_t(ValueType::kTensorRef));
    w.varint(1);
    w.u8(uint8_t(ValueType::kTensorWritten));
    w.varint(1);
    w.varint(0);
    enc.finish(&out);
    std::string path = temp_path("written.dtr");
    write_file(path, out);
    TraceReader r;
    ASSERT_TRUE(r.open(path).ok()) << r.error();
    ASSERT_EQ(r.next(), ReadResult::kRecord);
    ASSERT_EQ(r.next(), ReadResult::kRecord);
    const OpRecord& op = r.op();
    ASSERT_EQ(op.input_tensors, (std::vector<int64_t>{0, 0, 0}));
    EXPECT_FALSE(op.input_written(0));
    EXPECT_FALSE(op.input_written(1));
    EXPECT_TRUE(op.input_written(2));
  }
}

// _fused_adamw_(Tensor(a!)[] self, ..., Tensor(c!)[] exp_avgs, ...) -> (): its written section
// holds the lists after the op, read as outputs after the returns, each named by its argument.
TEST(TraceTest, TheWrittenSectionReadsAsOutputsAfterTheReturns) {
  std::string out;
  RecordEncoder enc;
  enc.header(StreamHeader{}, &out);
  enc.string("aten::_fused_adamw_", &out);  // 0
  enc.string("self", &out);                 // 1
  enc.string("max_exp_avg_sqs", &out);      // 2
  enc.string("running_mean", &out);         // 3
  ByteWriter& w = enc.begin(RecordKind::kOp);
  w.zvarint(1);
  w.varint(0);
  w.u8(uint8_t(Phase::kOptimizer));
  w.varint(0);
  w.varint(1);  // one input: a list of one new tensor
  w.u8(uint8_t(ValueType::kList));
  w.varint(1);
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(1), 0);
  w.varint(0);  // returns nothing
  w.varint(3);  // written: self (2 tensors), max_exp_avg_sqs (an empty list), running_mean
  w.varint(1);
  w.u8(uint8_t(ValueType::kList));
  w.varint(2);
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(2), 0);
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(3), 0);
  w.varint(2);
  w.u8(uint8_t(ValueType::kList));
  w.varint(0);
  w.varint(3);
  w.u8(uint8_t(ValueType::kTensorNew));
  write_tensor(w, sample_tensor(4), 0);
  enc.finish(&out);
  const std::string path = temp_path("written_section.dtr");
  write_file(path, out);
  TraceReader r;
  ASSERT_TRUE(r.open(path).ok()) << r.error();
  do ASSERT_EQ(r.next(), ReadResult::kRecord);
  while (r.kind() != RecordKind::kOp);
  const OpRecord& op = r.op();
  EXPECT_EQ(op.input_tensors, (std::vector<int64_t>{0}));
  EXPECT_EQ(op.output_tensors, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(op.returned_tensors, 0u);
  ASSERT_EQ(op.written_args.size(), 3u);
  EXPECT_EQ(written_argument(op, r, 0), "self[0]");
  EXPECT_EQ(written_argument(op, r, 1), "self[1]");
  EXPECT_EQ(written_argument(op, r, 2), "running_mean");
  EXPECT_EQ(r.tensor(3)->digest[0], 4);
  EXPECT_EQ(r.next(), ReadResult::kEof);
}

TEST(TraceTest, NotATraceIsRejectedAtOpen) {
  std::string path = temp_path("garbage.dtr");
  write_file(path, "hello, this is not a trace at all");
  TraceReader r;
  EXPECT_FALSE(r.open(path).ok());
}

TEST(DigestTest, KnownVectors) {
  for (auto [algo, hex] :
       {std::pair{DigestAlgo::kMd5, "900150983cd24fb0d6963f7d28e17f72"},
        std::pair{DigestAlgo::kSha256,
                  "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}}) {
    Hasher h(algo);
    h.update("abc", 3);
    TensorDesc t;
    h.finish(t.digest.data());
    t.digest_len = uint8_t(h.length());
    EXPECT_EQ(t.digest_hex(), hex);
  }
}

TEST(DigestTest, ChunkingDoesNotChangeTheDigest) {
  std::vector<float> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 977) * 0.25f - 7.f;
  for (DigestAlgo algo : {DigestAlgo::kMd5, DigestAlgo::kSha256, DigestAlgo::kXxh3}) {
    Hasher h(algo);
    TensorDesc whole, pieces;
    TensorDigester a(&h, Dtype::kFloat32, true);
    a.update(data.data(), data.size() * 4);
    a.finish(&whole);
    TensorDigester b(&h, Dtype::kFloat32, true);
    for (size_t i = 0; i < data.size(); i += 333)
      b.update(&data[i], std::min<size_t>(333, data.size() - i) * 4);
    b.finish(&pieces);
    EXPECT_TRUE(whole.same_digest(pieces)) << digest_name(algo);
    EXPECT_DOUBLE_EQ(whole.stats.min, pieces.stats.min);
  }
}

TEST(StatsTest, FloatStatsSkipNanAndCountInf) {
  float data[] = {1.f, -2.f, NAN, 4.f, INFINITY};
  StatsAccumulator s(Dtype::kFloat32);
  s.update(data, sizeof data);
  TensorStats st = s.finish();
  EXPECT_EQ(st.nan, 1u);
  EXPECT_EQ(st.inf, 1u);
  EXPECT_EQ(st.min, -2);
  EXPECT_TRUE(std::isinf(st.max));
}

TEST(StatsTest, IntegerAndBoolStats) {
  int64_t v[] = {5, -3, 10};
  StatsAccumulator s(Dtype::kInt64);
  s.update(v, sizeof v);
  TensorStats st = s.finish();
  EXPECT_EQ(st.min, -3);
  EXPECT_EQ(st.max, 10);
  EXPECT_DOUBLE_EQ(st.mean, 4);
  uint8_t b[] = {1, 0, 1, 1};
  StatsAccumulator sb(Dtype::kBool);
  sb.update(b, sizeof b);
  EXPECT_DOUBLE_EQ(sb.finish().mean, 0.75);
}

TEST(StatsTest, HalfAndBFloat16) {
  uint16_t half[] = {0x3c00, 0xc000};  // 1.0, -2.0
  uint16_t bf16[] = {0x3f80, 0x4040};  // 1.0, 3.0
  StatsAccumulator h(Dtype::kFloat16), b(Dtype::kBFloat16);
  h.update(half, sizeof half);
  b.update(bf16, sizeof bf16);
  EXPECT_EQ(h.finish().min, -2);
  EXPECT_EQ(b.finish().max, 3);
}

}  // namespace
}  // namespace detaudit::trace

namespace detaudit::trace {
namespace {

// The vector path and the scalar reference agree on every statistic, NaN and Inf included,
// for every length (tails) and for half precision fed through the same path.
TEST(StatsTest, VectorPathMatchesScalarReference) {
  for (size_t n : {0u, 1u, 3u, 4u, 5u, 17u, 1023u, 1024u, 1025u, 5000u, 40000u, 70001u}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((i * 7919) % 113) - 56.f;
    if (n == 70001) {  // blocks of finite values only, then one Inf deep inside: both paths
      v[2048 + 77] = INFINITY;
    } else if (n > 10 && n != 40000) {  // 40000: finite only, all on the fast path
      v[3] = NAN;
      v[9] = -INFINITY;
      v[n - 1] = NAN;
    }
    StatsAccumulator a(Dtype::kFloat32);
    a.update(v.data(), n * 4);
    TensorStats st = a.finish();
    double mn = INFINITY, mx = -INFINITY, sum = 0;
    uint64_t nan = 0, inf = 0, count = 0;
    for (float x : v) {
      if (x != x) {
        ++nan;
        continue;
      }
      inf += std::isinf(x);
      mn = std::min(mn, double(x));
      mx = std::max(mx, double(x));
      sum += x;
      ++count;
    }
    EXPECT_EQ(st.nan, nan) << n;
    EXPECT_EQ(st.inf, inf) << n;
    if (count) {
      EXPECT_EQ(st.min, mn) << n;
      EXPECT_EQ(st.max, mx) << n;
      if (!inf) {
        EXPECT_NEAR(st.mean, sum / double(count), 1e-4) << n;
      }
    }
  }
}

}  // namespace
}  // namespace detaudit::trace

namespace detaudit::trace {
namespace {

TensorDesc digest_of(DigestAlgo algo, const std::vector<float>& v,
                     const std::function<void(TensorDigester&)>& feed) {
  Hasher h(algo);
  TensorDigester d(&h, Dtype::kFloat32, true);
  feed(d);
  TensorDesc out;
  d.finish(&out);
  return out;
}

void expect_same(const TensorDesc& a, const TensorDesc& b, const std::string& what) {
  EXPECT_TRUE(a.same_digest(b)) << what;
  EXPECT_EQ(a.stats.min, b.stats.min) << what;
  EXPECT_EQ(a.stats.max, b.stats.max) << what;
  EXPECT_EQ(a.stats.mean, b.stats.mean) << what;  // bit for bit, not near
  EXPECT_EQ(a.stats.l2, b.stats.l2) << what;
  EXPECT_EQ(a.stats.nan, b.stats.nan) << what;
}

// Whatever the split of the input and the number of threads, a tensor gets one digest and one
// set of statistics.
TEST(DigestTreeTest, SameDigestAndStatsWhateverTheSplitAndThreads) {
  const ParallelFor serial = [](size_t n, const std::function<void(size_t, size_t)>& fn) {
    fn(0, n);
  };
  const ParallelFor three_threads = [](size_t n, const std::function<void(size_t, size_t)>& fn) {
    std::vector<std::thread> pool;
    for (size_t k = 0; k < 3; ++k) pool.emplace_back([&, k] { fn(n * k / 3, n * (k + 1) / 3); });
    for (auto& t : pool) t.join();
  };
  const size_t leaf_floats = kLeafBytes / 4;
  // 3.5 leaves: one vector pass of 3 MD5 leaves and a short leaf, or on 3 threads one by one;
  // 16: one full pass; 33.5: three passes of 11 leaves and a short leaf, spread over the threads.
  for (size_t n : {size_t(0), size_t(1000), size_t(16384), size_t(16385), leaf_floats,
                   leaf_floats + 1, leaf_floats * 7 / 2, leaf_floats * 16, leaf_floats * 67 / 2}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((i * 2654435761u) % 10007) * 1e-3f - 5.f;
    if (n > 5000) v[n - 3000] = NAN;
    for (DigestAlgo algo : {DigestAlgo::kMd5, DigestAlgo::kSha256, DigestAlgo::kXxh3}) {
      const std::string what = std::string(digest_name(algo)) + " n=" + std::to_string(n);
      TensorDesc whole = digest_of(algo, v, [&](TensorDigester& d) { d.update(v.data(), n * 4); });
      TensorDesc pieces = digest_of(algo, v, [&](TensorDigester& d) {
        const auto* p = reinterpret_cast<const uint8_t*>(v.data());
        for (size_t off = 0; off < n * 4; off += 4099)
          d.update(p + off, std::min<size_t>(4099, n * 4 - off));
      });
      TensorDesc one = digest_of(algo, v,
                                 [&](TensorDigester& d) { d.update_all(v.data(), n * 4, serial); });
      TensorDesc three = digest_of(
          algo, v, [&](TensorDigester& d) { d.update_all(v.data(), n * 4, three_threads, 3); });
      expect_same(whole, pieces, what + " pieces");
      expect_same(whole, one, what + " update_all");
      expect_same(whole, three, what + " 3 threads");
      if (n > 5000) {
        EXPECT_EQ(whole.stats.nan, 1u) << what;
      }
    }
  }
}

// A strided view digests as the bytes of its elements in logical order, whichever way it is
// gathered: whole into the staging buffer (small views), or row by row (views beyond it).
TEST(DigestTreeTest, StridedViewsDigestAsTheirLogicalBytes) {
  struct View {
    const char* what;
    std::vector<int64_t> sizes, strides;
    int64_t offset;  // elements into the base
  };
  const int64_t big = 520;  // 520 x 520 elements: past the staging buffer for every dtype here
  const View views[] = {
      {"transposed", {10, 6}, {1, 10}, 0},
      {"transposed, short rows", {64, 4}, {1, 64}, 0},
      {"3-d permutation", {5, 4, 3}, {1, 15, 5}, 0},
      {"flipped rows (negative stride)", {6, 10}, {-10, 1}, 50},
      {"flipped columns", {6, 10}, {10, -1}, 9},
      {"every other row and column", {3, 5}, {20, 2}, 1},
      {"expanded row (zero stride)", {7, 10}, {0, 1}, 20},
      {"expanded bias, more rows than columns", {40, 6}, {0, 1}, 0},
      {"expanded column", {6, 40}, {1, 0}, 0},
      {"broadcast over a middle dim", {3, 5, 8}, {8, 0, 1}, 0},
      {"all broadcast", {4, 3}, {0, 0}, 7},
      {"heads split from a sequence (runs in both)", {2, 4, 6, 8}, {192, 8, 32, 1}, 0},
      {"size-1 dims around a column", {1, 6, 1}, {60, 10, 1}, 9},
      {"seven dims", {2, 2, 2, 2, 2, 2, 2}, {1, 2, 4, 8, 16, 32, 64}, 0},
      // 4-byte elements go through 8x8 tiles (AVX2), with the edges element by element.
      {"transposed, tiles and edges", {21, 19}, {1, 21}, 0},
      {"transposed, a gap between columns", {9, 17}, {1, 11}, 3},
      {"batched transposes", {3, 12, 10}, {120, 1, 12}, 0},
      {"batched transposes, batch dim last in memory", {2, 8, 9}, {1, 2, 16}, 0},
      {"large, transposed", {big, big}, {1, big}, 0},
  };
  struct SizedDtype {
    Dtype code;
    size_t size;
  };
  const SizedDtype dtypes[] = {{Dtype::kUInt8, 1},
                               {Dtype::kFloat16, 2},
                               {Dtype::kFloat32, 4},
                               {Dtype::kFloat64, 8},
                               {Dtype::kComplex128, 16}};
  for (const SizedDtype& dt : dtypes) {
    std::vector<uint8_t> base(size_t(big * big) * dt.size);
    for (size_t i = 0; i < base.size(); ++i) base[i] = uint8_t((i * 2654435761u) >> 13);
    for (const View& v : views) {
      const std::vector<uint8_t> logical = logical_bytes(base, dt.size, v.sizes, v.strides,
                                                         v.offset);
      for (DigestAlgo algo : {DigestAlgo::kMd5, DigestAlgo::kSha256, DigestAlgo::kXxh3}) {
        const std::string what = std::string(v.what) + ", " + std::string(digest_name(algo)) +
                                 ", dtype " + std::string(dtype_name(dt.code));
        Hasher h(algo);
        TensorDigester want_d(&h, dt.code, true);
        want_d.update(logical.data(), logical.size());
        TensorDesc want;
        want_d.finish(&want);
        TensorDigester got_d(&h, dt.code, true);
        feed_strided(base.data() + v.offset * int64_t(dt.size), dt.size, v.sizes.data(),
                     v.strides.data(), v.sizes.size(), &got_d);
        TensorDesc got;
        got_d.finish(&got);
        expect_same(want, got, what);
      }
    }
  }
}

// Up to one leaf, the digest is the plain digest of the bytes (md5sum of the raw tensor); above,
// the root hashes the tree header and the leaves' digests, as docs/trace-format.md says.
TEST(DigestTreeTest, PlainUpToOneLeafThenTreeOfLeaves) {
  auto plain = [](const uint8_t* p, size_t n, uint8_t* out) {
    Hasher h(DigestAlgo::kMd5);
    h.update(p, n);
    h.finish(out);
  };
  std::vector<uint8_t> bytes(kLeafBytes * 2 + 10);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 31 + (i >> 13));

  Hasher h(DigestAlgo::kMd5);
  TensorDigester one_leaf(&h, Dtype::kUInt8, false);
  one_leaf.update(bytes.data(), kLeafBytes);
  TensorDesc got;
  one_leaf.finish(&got);
  TensorDesc want;
  plain(bytes.data(), kLeafBytes, want.digest.data());
  EXPECT_TRUE(std::equal(want.digest.begin(), want.digest.begin() + 16, got.digest.begin()));

  TensorDigester tree(&h, Dtype::kUInt8, false);
  tree.update(bytes.data(), bytes.size());
  tree.finish(&got);
  std::string root_input("detaudit-tree-1", 16);
  const uint64_t sizes[2] = {kLeafBytes, bytes.size()};
  root_input.append(reinterpret_cast<const char*>(sizes), sizeof sizes);
  for (size_t off = 0; off < bytes.size(); off += kLeafBytes) {
    uint8_t d[16];
    plain(bytes.data() + off, std::min(kLeafBytes, bytes.size() - off), d);
    root_input.append(reinterpret_cast<const char*>(d), 16);
  }
  plain(reinterpret_cast<const uint8_t*>(root_input.data()), root_input.size(), want.digest.data());
  EXPECT_TRUE(std::equal(want.digest.begin(), want.digest.begin() + 16, got.digest.begin()));

  // The same root when the two whole leaves go through MD5's vector lanes.
  TensorDigester lanes(&h, Dtype::kUInt8, false);
  lanes.update_all(bytes.data(), bytes.size(),
                   [](size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); });
  lanes.finish(&got);
  EXPECT_TRUE(std::equal(want.digest.begin(), want.digest.begin() + 16, got.digest.begin()));
}

// Hasher's XXH3 (AVX-512 or AVX2 where the CPU has it) gives the packaged library's digest, however the
// bytes are fed.
TEST(DigestTest, Xxh3IsTheLibrarysWhateverTheBuild) {
  std::vector<uint8_t> bytes(300000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t((i * 2654435761u) >> 11);
  for (size_t n : {size_t(0), size_t(1), size_t(17), size_t(240), size_t(241), size_t(1024),
                   size_t(4099), size_t(300000)}) {
    XXH128_canonical_t want;
    XXH128_canonicalFromHash(&want, XXH3_128bits(bytes.data(), n));
    for (size_t piece : {n + 1, size_t(7), size_t(1000)}) {
      Hasher h(DigestAlgo::kXxh3);
      for (size_t off = 0; off < n; off += piece)
        h.update(bytes.data() + off, std::min(piece, n - off));
      uint8_t got[16];
      h.finish(got);
      EXPECT_EQ(0, std::memcmp(want.digest, got, 16)) << "n=" << n << " piece=" << piece;
    }
  }
#if defined(__x86_64__)
  // Each vector build this CPU can run, not only the widest that Hasher picks.
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  for (const Xxh3Wide* build : {avx512 ? xxh3_avx512() : nullptr, avx2 ? xxh3_avx2() : nullptr}) {
    if (!build) continue;
    for (size_t n : {size_t(0), size_t(17), size_t(241), size_t(4099), size_t(300000)}) {
      XXH128_canonical_t want;
      XXH128_canonicalFromHash(&want, XXH3_128bits(bytes.data(), n));
      uint8_t got[16];
      build->oneshot(bytes.data(), n, got);
      EXPECT_EQ(0, std::memcmp(want.digest, got, 16)) << build->isa << " oneshot n=" << n;
      Xxh3WideState* s = build->create();
      for (size_t off = 0; off < n; off += 1000)
        build->update(s, bytes.data() + off, std::min<size_t>(1000, n - off));
      build->digest(s, got);
      build->destroy(s);
      EXPECT_EQ(0, std::memcmp(want.digest, got, 16)) << build->isa << " streamed n=" << n;
    }
  }
  EXPECT_EQ(xxh3_wide() != nullptr, (avx512 && xxh3_avx512()) || (avx2 && xxh3_avx2()));
#endif
}

// Each lane is the MD5 of its own message, for any whole number of blocks, with lanes that share
// their bytes too; all 16 in use, or a few (one AVX2 register instead of two).
TEST(Md5LanesTest, EachLaneIsTheMd5OfItsMessage) {
  if (!Md5Lanes::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the lanes are not used";
  std::vector<uint8_t> bytes(16 * 8192);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t((i * 2654435761u) >> 13);
  for (size_t used : {Md5Lanes::kLanes, size_t(6)})
    for (size_t len : {size_t(0), size_t(64), size_t(192), size_t(8192)}) {
      const uint8_t* lane[Md5Lanes::kLanes];
      for (size_t l = 0; l < Md5Lanes::kLanes; ++l)
        lane[l] = bytes.data() + (l == 5 ? 0 : l) * 8192;  // lane 5 aliases lane 0
      Md5Lanes md5(used);
      // Fed in two uneven calls, as the digester feeds statistics blocks.
      const size_t first = len / 64 / 3 * 64;
      md5.update(lane, first);
      const uint8_t* rest[Md5Lanes::kLanes];
      for (size_t l = 0; l < Md5Lanes::kLanes; ++l) rest[l] = lane[l] + first;
      md5.update(rest, len - first);
      uint8_t got[Md5Lanes::kLanes][16];
      md5.finish(len, got);
      for (size_t l = 0; l < used; ++l) {
        Hasher h(DigestAlgo::kMd5);
        h.update(lane[l], len);
        uint8_t want[16];
        h.finish(want);
        EXPECT_EQ(0, std::memcmp(want, got[l], 16))
            << "lane " << l << " length " << len << " of " << used;
      }
    }
}

// fn over [0, n) cut across `threads` std::threads, as at::parallel_for cuts it.
void on_threads(size_t threads, size_t n, const std::function<void(size_t, size_t)>& fn) {
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    const size_t begin = n * t / threads, end = n * (t + 1) / threads;
    if (begin < end) pool.emplace_back(fn, begin, end);
  }
  for (std::thread& t : pool) t.join();
}

// A batch's tensors of any lengths, sharing lanes, each get the digest and the statistics that
// TensorDigester gives their bytes: one tensor alone, a few, more than the lanes, a full batch;
// lengths on each side of MD5's padding edges and of a leaf's, tensors of several leaves (a tree,
// its leaves in the lanes beside the small tensors); run on this thread, or cut into groups on
// several.
TEST(Md5BatchTest, EachTensorHasTheDigestAndStatisticsOfItsBytes) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  // Tensors start at offsets up to 56 bytes in, so the longest still ends inside.
  std::vector<uint8_t> bytes(Md5Batch::kMaxTensorBytes + 64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t((i * 2654435761u) >> 11);
  const size_t lengths[] = {1, 55, 56, 63, 64, 65, 119, 120, 128, 4096, 20000, 70000, 4, 8};
  const size_t large[] = {Md5Batch::kMaxTensorBytes, kLeafBytes,    kLeafBytes + 1, 2 * kLeafBytes,
                          3 * kLeafBytes + 12345,    kLeafBytes - 1};
  auto serially = [](size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); };
  Md5Batch batch;
  for (size_t threads : {size_t(1), size_t(2), size_t(5)}) {
    for (size_t count :
         {size_t(1), size_t(2), size_t(7), size_t(16), size_t(17), Md5Batch::kMaxTensors}) {
      std::vector<TensorDesc> want(count);
      std::vector<size_t> index(count);
      for (size_t m = 0; m < count; ++m) {
        const size_t n = m % 8 == 5 && m / 8 < std::size(large)
                             ? large[(m / 8 + count) % std::size(large)]
                             : lengths[(m * 7 + count) % std::size(lengths)];
        const Dtype dtype = m % 3 == 0   ? Dtype::kFloat32
                            : m % 3 == 1 ? Dtype::kInt32
                                         : Dtype::kFloat64;
        const bool with_stats = m % 4 != 3;
        const uint8_t* data = bytes.data() + (m * 8) % 64;
        ASSERT_TRUE(batch.has_room(n)) << "tensor " << m << " of " << count;
        std::memcpy(batch.reserve(n), data, n);
        index[m] = batch.commit(dtype, with_stats);
        Hasher h(DigestAlgo::kMd5);
        TensorDigester d(&h, dtype, with_stats);
        d.update_all(data, n, serially);
        d.finish(&want[m]);
      }
      EXPECT_EQ(batch.full(), count == Md5Batch::kMaxTensors);
      if (threads == 1)
        batch.run();
      else
        batch.run(
            [&](size_t n, const std::function<void(size_t, size_t)>& fn) {
              on_threads(threads, n, fn);
            },
            threads);
      for (size_t m = 0; m < count; ++m) {
        TensorDesc got;
        batch.result(index[m]).fill(&got);
        const std::string where = "tensor " + std::to_string(m) + " of " + std::to_string(count) +
                                  ", " + std::to_string(threads) + " threads";
        EXPECT_EQ(0, std::memcmp(want[m].digest.data(), got.digest.data(), 16)) << where;
        EXPECT_EQ(want[m].digest_len, got.digest_len);
        EXPECT_EQ(want[m].bits, got.bits) << where;
        EXPECT_EQ(0, std::memcmp(&want[m].stats, &got.stats, sizeof got.stats)) << where;
      }
      batch.clear();
    }
  }
}

// The batch says when it is out of room, by messages and by bytes, and is whole again once cleared.
TEST(Md5BatchTest, HasRoomForAsManyMessagesAndBytesAsItHolds) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  Md5Batch batch;
  for (size_t m = 0; m < Md5Batch::kMaxTensors; ++m) {
    ASSERT_TRUE(batch.has_room(100));
    std::memset(batch.reserve(100), int(m), 100);
    batch.commit(Dtype::kUInt8, false);
  }
  EXPECT_FALSE(batch.has_room(1));
  batch.clear();
  size_t whole = 0;
  while (batch.has_room(Md5Batch::kMaxTensorBytes)) {
    std::memset(batch.reserve(Md5Batch::kMaxTensorBytes), 1, Md5Batch::kMaxTensorBytes);
    batch.commit(Dtype::kUInt8, false);
    ++whole;
  }
  EXPECT_EQ(whole,
            Md5Batch::kArenaBytes / Md5Batch::kMaxTensorBytes - 1);  // padding takes a block each
  EXPECT_TRUE(batch.has_room(1000));
  batch.clear();
  EXPECT_TRUE(batch.has_room(Md5Batch::kMaxTensorBytes));
}

}  // namespace
}  // namespace detaudit::trace

namespace detaudit::trace {
namespace {

// Dims keeps its values across the inline/heap boundary, both ways, like std::vector.
TEST(DimsTest, ResizeKeepsValuesAcrossTheInlineBoundary) {
  Dims d = {1, 2, 3};
  d.resize(9);
  for (size_t i = 3; i < 9; ++i) d[i] = int64_t(i + 1);
  EXPECT_EQ(d.to_vector(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  d.resize(4);
  EXPECT_EQ(d.to_vector(), (std::vector<int64_t>{1, 2, 3, 4}));
  d.resize(7);
  d[4] = d[5] = d[6] = 0;
  EXPECT_EQ(d.to_vector(), (std::vector<int64_t>{1, 2, 3, 4, 0, 0, 0}));
  Dims copy = d;
  EXPECT_EQ(copy, d);
  copy[6] = 5;
  EXPECT_NE(copy, d);
  copy.assign(d.begin(), d.begin() + 2);
  EXPECT_EQ(copy.to_vector(), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace detaudit::trace

// The label detaudit's Python hooks open inside an optimizer step, found in a scope path among
// the user's own scopes, and taken out of it for the report.
TEST(OptimizerStepLabelTest, IsFoundAmongTheUsersScopesAndTakenOut) {
  using detaudit::trace::find_optimizer_step_label;
  using detaudit::trace::without_optimizer_step_label;
  auto label = find_optimizer_step_label("train/detaudit::optimizer_step 2 AdamW 7");
  ASSERT_TRUE(label.has_value());
  EXPECT_EQ(label->ordinal, 2u);
  EXPECT_EQ(label->optimizer, "AdamW");
  EXPECT_EQ(label->tensors, 7u);
  EXPECT_EQ(without_optimizer_step_label("train/detaudit::optimizer_step 2 AdamW 7"), "train");
  EXPECT_EQ(without_optimizer_step_label("detaudit::optimizer_step 1 SGD 2/closure"), "closure");
  EXPECT_EQ(without_optimizer_step_label("a/detaudit::optimizer_step 1 SGD 2/b"), "a/b");
  EXPECT_EQ(without_optimizer_step_label("detaudit::optimizer_step 1 SGD 2"), "");
  EXPECT_EQ(without_optimizer_step_label("train/step"), "train/step");
  // Not the label: another scope, a count that is no number, an ordinal 0, a part missing.
  EXPECT_FALSE(find_optimizer_step_label("train/step").has_value());
  EXPECT_FALSE(find_optimizer_step_label("detaudit::optimizer_step x Adam 7").has_value());
  EXPECT_FALSE(find_optimizer_step_label("detaudit::optimizer_step 0 Adam 7").has_value());
  EXPECT_FALSE(find_optimizer_step_label("detaudit::optimizer_step 1 7").has_value());
  EXPECT_FALSE(find_optimizer_step_label("detaudit::optimizer_step 1 Adam").has_value());
  EXPECT_FALSE(find_optimizer_step_label("").has_value());
}
