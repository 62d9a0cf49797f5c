// show/export's reading of a run: counts, cut-short streams, JSON Lines values, corrupt files.
#include "summary/summary.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "summary/timeline.h"
#include "trace/records.h"

namespace detaudit::summary {
namespace {

namespace fs = std::filesystem;
using namespace trace;
using nlohmann::json;

TensorDesc tensor(uint8_t fill, std::vector<int64_t> sizes) {
  TensorDesc t;
  t.dtype = trace::Dtype::kFloat32;
  t.bits = kTensorContiguous | kTensorHasStats;
  t.sizes.assign(sizes.begin(), sizes.end());
  t.digest_len = 16;
  t.digest.fill(fill);
  t.stats.min = -1;
  t.stats.max = 2;
  t.stats.mean = 0.5;
  t.stats.l2 = 3;
  return t;
}

// Two steps: step 0 has aten::linear > aten::t (forward) and a backward op; step 1 one op.
// `with_end` adds the END record.
std::string sample_trace(bool with_end) {
  std::string out;
  RecordEncoder enc;
  StreamHeader h;
  h.pid = 7;
  enc.header(h, &out);
  enc.string("aten::linear", &out);    // 0
  enc.string("aten::t", &out);         // 1
  enc.string("AddmmBackward0", &out);  // 2
  enc.string("sum", &out);             // 3
  StepInfo s;
  enc.step(s, &out);
  uint64_t order = 0;
  auto op = [&](uint32_t name, Phase phase, uint32_t depth, bool new_in, uint8_t fill) {
    OpHead head;
    head.previous_order = order;
    head.order = ++order;
    head.name_id = name;
    head.bits = uint8_t(phase);
    head.depth = depth;
    ByteWriter& w = enc.begin_op(head);
    if (new_in) {
      w.varint(3);
      w.u8(uint8_t(ValueType::kTensorNew));
      write_tensor(w, tensor(0x11, {4, 3}), 0);
      w.u8(uint8_t(ValueType::kIntList));
      w.varint(2);
      w.zvarint(1);
      w.zvarint(-1);
      w.u8(uint8_t(ValueType::kString));
      w.varint(3);
    } else {
      w.varint(1);
      w.u8(uint8_t(ValueType::kTensorRef));
      w.varint(1);
    }
    w.varint(1);
    w.u8(uint8_t(ValueType::kTensorNew));
    write_tensor(w, tensor(fill, {4, 2}), 0);
    enc.finish(&out);
  };
  op(0, Phase::kForward, 0, true, 0xaa);
  op(1, Phase::kForward, 1, false, 0xbb);
  op(2, Phase::kBackward, 0, false, 0xcc);
  s.step = 1;
  s.order = 4;
  enc.step(s, &out);
  op(0, Phase::kForward, 0, false, 0xdd);
  if (with_end) {
    EndInfo e;
    e.ops = 4;
    e.tensors_hashed = 5;
    e.bytes_hashed = 160;
    enc.end(e, &out);
  }
  return out;
}

std::string make_run(const std::string& name, const std::string& t0, const std::string& t1) {
  fs::path dir = fs::path(::testing::TempDir()) / ("detaudit_summary_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir / "streams");
  std::ofstream(dir / "streams" / "r0.main.t0.dtr", std::ios::binary) << t0;
  if (!t1.empty()) std::ofstream(dir / "streams" / "r0.main.t1.dtr", std::ios::binary) << t1;
  std::ofstream(dir / "streams" / "r0.main.status") << "attached\n";
  std::ofstream(dir / "run.json") << R"({"command": ["python3", "t.py"], "exit_code": 0,
                                        "signal": null, "finished": true})";
  return dir.string();
}

TEST(SummaryTest, CountsOpsStepsPhasesAndEnd) {
  std::string full = sample_trace(true);
  std::string cut = sample_trace(false);
  cut.resize(cut.size() - 3);  // the writer died inside the last op
  std::string dir = make_run("counts", full, cut);
  RunSummary s;
  Status st = summarize_run(dir, "", &s);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(s.streams.size(), 2u);
  const StreamSummary& a = s.streams[0];
  EXPECT_EQ(a.name, "r0.main.t0");
  EXPECT_EQ(a.ops, 4u);
  EXPECT_EQ(a.phase_ops[0], 3u);
  EXPECT_EQ(a.phase_ops[1], 1u);
  EXPECT_EQ(a.step_records, 2u);
  EXPECT_EQ(a.last_step, 1u);
  EXPECT_TRUE(a.saw_end);
  EXPECT_EQ(a.end.bytes_hashed, 160u);
  EXPECT_EQ(a.op_counts.at("aten::linear"), 2u);
  const StreamSummary& b = s.streams[1];
  EXPECT_FALSE(b.saw_end);
  EXPECT_TRUE(b.cut_short);
  EXPECT_NE(b.cut_reason.find("offset"), std::string::npos);
  EXPECT_EQ(b.ops, 3u);
  auto top = top_ops(s, 15);
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(top[0].first, "aten::linear");
  EXPECT_EQ(top[0].second, 3u);
  EXPECT_EQ(s.run_json["exit_code"], 0);
  ASSERT_EQ(s.statuses.size(), 1u);
  EXPECT_EQ(s.statuses[0].second, "attached");
}

TEST(SummaryTest, StreamFilter) {
  std::string dir = make_run("filter", sample_trace(true), sample_trace(true));
  RunSummary s;
  ASSERT_TRUE(summarize_run(dir, "r0.main.t1", &s).ok());
  ASSERT_EQ(s.streams.size(), 1u);
  EXPECT_EQ(s.streams[0].name, "r0.main.t1");
  Status st = summarize_run(dir, "r9.main.t0", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("r0.main.t0, r0.main.t1"), std::string::npos) << st.message();
}

TEST(SummaryTest, StepOpsInOrderWithDepthAndDigest) {
  std::string dir = make_run("step", sample_trace(true), "");
  std::vector<OpLine> lines;
  ASSERT_TRUE(for_each_step_op(dir + "/streams/r0.main.t0.dtr", 0, [&](const OpLine& l) {
                lines.push_back(l);
              }).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].name, "aten::t");
  EXPECT_EQ(lines[1].depth, 1u);
  EXPECT_EQ(lines[1].digest_prefix, "bbbbbbbbbbbb");
  EXPECT_EQ(lines[1].shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(lines[2].phase, Phase::kBackward);
}

TEST(SummaryTest, ExportWritesOneObjectPerRecord) {
  std::string dir = make_run("export", sample_trace(true), "");
  std::ostringstream out;
  std::vector<std::string> notes;
  ASSERT_TRUE(export_run(dir, "", out, &notes).ok());
  EXPECT_TRUE(notes.empty());
  std::istringstream in(out.str());
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 1u + 2 + 4 + 1);  // header, steps, ops, end
  EXPECT_EQ(lines[0]["record"], "header");
  EXPECT_EQ(lines[0]["pid"], 7);
  EXPECT_EQ(lines[1]["record"], "step");
  const json& op = lines[2];
  EXPECT_EQ(op["record"], "op");
  EXPECT_EQ(op["name"], "aten::linear");
  EXPECT_EQ(op["stream"], "r0.main.t0");
  ASSERT_EQ(op["inputs"].size(), 3u);
  EXPECT_EQ(op["inputs"][0]["dtype"], "float32");
  EXPECT_EQ(op["inputs"][0]["shape"], json({4, 3}));
  EXPECT_EQ(op["inputs"][0]["digest"], std::string(32, '1'));
  EXPECT_EQ(op["inputs"][0]["stats"]["max"], 2.0);
  EXPECT_EQ(op["inputs"][0]["provenance"], "output");
  EXPECT_EQ(op["inputs"][1], json({1, -1}));
  EXPECT_EQ(op["inputs"][2], "sum");
  EXPECT_EQ(op["outputs"][0]["digest"], std::string(32, 'a'));
  // The ref in the next op resolves to the previous output.
  EXPECT_EQ(lines[3]["inputs"][0]["digest"], std::string(32, 'a'));
  EXPECT_EQ(lines[3]["inputs"][0]["new"], false);
  EXPECT_EQ(lines.back()["record"], "end");
}

TEST(SummaryTest, CorruptTraceNamesFileAndOffsetAfterWritingWhatWasReadable) {
  std::string bytes = sample_trace(true);
  bytes[bytes.size() - 20] ^= 0x40;
  std::string dir = make_run("corrupt", bytes, "");
  RunSummary s;
  Status st = summarize_run(dir, "", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
  EXPECT_NE(st.message().find("r0.main.t0.dtr: offset "), std::string::npos) << st.message();
  std::ostringstream out;
  std::vector<std::string> notes;
  st = export_run(dir, "", out, &notes);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
  EXPECT_NE(out.str().find("\"header\""), std::string::npos);
}

// Found by fuzz_trace_reader (docs/fuzzing.md): a name that is not UTF-8 (here a thread's and an
// op's) made nlohmann's dump throw, and `export --perfetto` and `diff --perfetto` stopped there.
TEST(SummaryTest, TimelineReplacesInvalidUtf8InRecordedNames) {
  std::string bytes;
  RecordEncoder enc;
  StreamHeader h;
  h.thread = "worker\xff";
  enc.header(h, &bytes);
  enc.string("aten::\xfe\xff", &bytes);
  enc.step(StepInfo{}, &bytes);
  ByteWriter& w = enc.begin(RecordKind::kOp);
  w.zvarint(0);  // order
  w.varint(0);   // name
  w.u8(0);       // forward
  w.varint(0);   // depth
  w.varint(0);   // no inputs
  w.varint(0);   // no outputs
  enc.finish(&bytes);
  std::string dir = make_run("timeline_utf8", bytes, "");
  std::ostringstream out;
  Status st;
  ASSERT_NO_THROW(st = write_timeline(dir, nullptr, out));
  ASSERT_TRUE(st.ok()) << st.message();
  json timeline = json::parse(out.str());
  std::string names;
  for (const json& e : timeline["traceEvents"])
    names += e.contains("args") && e["args"].contains("name") ? e["args"]["name"].get<std::string>()
                                                              : e.value("name", "");
  EXPECT_NE(names.find("t-worker\xEF\xBF\xBD"), std::string::npos) << names;  // U+FFFD
  EXPECT_NE(names.find("aten::\xEF\xBF\xBD"), std::string::npos) << names;
}

// Found by fuzz_trace_reader: the process sort index was rank * 1000 + k, a signed overflow
// (undefined behaviour) for a rank near INT64_MAX in a corrupt header.
TEST(SummaryTest, TimelineSortIndexOfAHugeRankDoesNotOverflow) {
  std::string bytes;
  RecordEncoder enc;
  StreamHeader h;
  h.rank = INT64_MAX / 3;
  enc.header(h, &bytes);
  std::string dir = make_run("timeline_rank", bytes, "");
  std::ostringstream out;
  ASSERT_TRUE(write_timeline(dir, nullptr, out).ok());
  json timeline = json::parse(out.str());
  int64_t sort_index = 0;
  for (const json& e : timeline["traceEvents"])
    if (e["name"] == "process_sort_index") sort_index = e["args"]["sort_index"].get<int64_t>();
  EXPECT_GT(sort_index, 0);
}

}  // namespace
}  // namespace detaudit::summary
