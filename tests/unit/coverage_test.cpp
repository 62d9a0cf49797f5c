// `detaudit coverage`'s plan and judgement, on real trace files and replayer lines
// (src/replay/coverage.h). The capture and the replayer run in tests/e2e/test_coverage.py.
#include "replay/coverage.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_files.h"
#include "trace_builder.h"

namespace detaudit::replay {
namespace {

using namespace detaudit::testing;

Catalog shipped_catalog() {
  Catalog c;
  EXPECT_TRUE(Catalog::load(shipped_catalog_file(), &c).ok());
  return c;
}

const OpTypeRow* row_of(const CoveragePlan& p, const std::string& op, size_t nth = 0) {
  for (const OpTypeRow& r : p.rows)
    if (r.op == op && nth-- == 0) return &r;
  return nullptr;
}

std::string line(size_t row, const std::string& setting, int distinct, int threads = 2,
                 const std::string& error = "") {
  nlohmann::json j = {{"id", std::to_string(row)},
                      {"setting", setting},
                      {"replays", error.empty() ? 8 : 0},
                      {"threads", threads},
                      {"deterministic", setting == "under the remedy"},
                      {"busy_thread", setting == "under contention"},
                      {"distinct", distinct},
                      {"max_abs_diff", distinct > 1 ? 2e-9 : 0.0}};
  if (!error.empty()) j["error"] = error;
  return j.dump();
}

// Two index_put_impl_ of one type (the second larger), a mm, a collective, an empty, an
// autograd node and a compiled region, on the main thread of rank 0.
CoveragePlan planned(RunDir* run) {
  TraceBuilder b;
  b.step(0);
  b.op("aten::_index_put_impl_", Phase::kBackward, 0, 10)
      .in_new(tensor(1, {1024}))
      .in_new(tensor(2, {3000}, Provenance::kOutput, Dtype::kInt64))
      .in_new(tensor(3, {3000}))
      .out_ref(0)
      .done();
  b.op("aten::mm", Phase::kForward, 0, 11)
      .in_new(tensor(4, {8, 8}))
      .in_ref(3)
      .out_new(tensor(5, {8, 8}))
      .done();
  b.op("aten::_index_put_impl_", Phase::kBackward, 0, 12)
      .in_new(tensor(6, {1024}))
      .in_new(tensor(7, {4096}, Provenance::kOutput, Dtype::kInt64))
      .in_new(tensor(8, {4096}))
      .out_ref(5)
      .done();
  b.op("c10d::allreduce_", Phase::kBackward, 0, 13).in_ref(5).out_ref(5).done();
  b.op("aten::empty", Phase::kForward, 0, 14).in_int(8).out_new(uninitialized(9, {8})).done();
  b.op("MmBackward0", Phase::kBackward, 0, 15).in_ref(4).out_new(tensor(10, {8, 8})).done();
  b.op("Torch-Compiled Region: 0/0", Phase::kForward, 0, 16)
      .compiled_region()
      .in_ref(4)
      .out_new(tensor(11, {8, 8}))
      .done();
  b.end();
  run->add_stream("r0.main.t-main", b);
  run->env("r0.main", sample_env(2, 100));
  CoveragePlan plan;
  EXPECT_TRUE(plan_coverage(run->path(), shipped_catalog(), &plan).ok());
  return plan;
}

TEST(CoverageTest, ATypeIsReplayedAtItsLargestOccurrenceCountedInStartOrder) {
  RunDir run("coverage_plan");
  const CoveragePlan plan = planned(&run);
  EXPECT_EQ(plan.ops_scanned, 7u);
  const OpTypeRow* put = row_of(plan, "aten::_index_put_impl_");
  ASSERT_NE(put, nullptr);
  // One type (float32, 1-D, <=2^12 from its largest tensor), though the two differ in size.
  EXPECT_EQ(put->shape_class, "1-D, <=2^12");
  EXPECT_EQ(row_of(plan, "aten::_index_put_impl_", 1), nullptr);
  EXPECT_EQ(put->dtype, "float32");
  EXPECT_EQ(put->occurrences, 2u);
  EXPECT_EQ(put->target.index, 2u);       // the larger, third record of the stream
  EXPECT_EQ(put->target.occurrence, 1u);  // the second of its name, as the interposer counts
  EXPECT_EQ(put->target.process, "r0.main");
  EXPECT_EQ(put->target.thread, "main");
  EXPECT_EQ(put->target.intra_op_threads, 2);
  EXPECT_EQ(put->target.inputs.size(), 3u);
  EXPECT_TRUE(put->unverifiable.empty());
  EXPECT_FALSE(put->catalog_ids.empty());
  EXPECT_FALSE(put->remedy.empty());
  // Largest first: the budget goes to it before the mm.
  EXPECT_EQ(plan.rows.front().op, "aten::_index_put_impl_");
  EXPECT_TRUE(row_of(plan, "aten::mm")->catalog_ids.empty());
}

TEST(CoverageTest, WhatCannotBeReplayedOnItsOwnIsUnverifiedWithItsReason) {
  RunDir run("coverage_unverifiable");
  const CoveragePlan plan = planned(&run);
  EXPECT_NE(row_of(plan, "c10d::allreduce_")->unverifiable.find("a collective"), std::string::npos);
  EXPECT_NE(row_of(plan, "aten::empty")->unverifiable.find("uninitialized"), std::string::npos);
  EXPECT_NE(row_of(plan, "MmBackward0")->unverifiable.find("not a dispatcher op"),
            std::string::npos);
  EXPECT_NE(row_of(plan, "Torch-Compiled Region: 0/0")->unverifiable.find("torch.compile"),
            std::string::npos);
  // Only the replayable rows are captured.
  const nlohmann::json spec = capture_targets_json(plan, "/tmp/x");
  ASSERT_EQ(spec["targets"].size(), 2u);
  EXPECT_EQ(spec["targets"][0]["op"], "aten::_index_put_impl_");
  EXPECT_EQ(spec["targets"][0]["occurrence"], 1);
  EXPECT_EQ(spec["targets"][0]["dir"], "/tmp/x/0");
}

TEST(CoverageTest, EachTypeGetsOneVerdictFromItsReplays) {
  RunDir run("coverage_judge");
  CoveragePlan plan = planned(&run);
  for (OpTypeRow& r : plan.rows)
    if (r.unverifiable.empty()) r.capture_status = "saved";
  const size_t put = size_t(row_of(plan, "aten::_index_put_impl_") - plan.rows.data());
  const size_t mm = size_t(row_of(plan, "aten::mm") - plan.rows.data());
  for (const auto& [setting, k] : std::vector<std::pair<std::string, int>>{
           {"as recorded", 1}, {"under contention", 5}, {"under the remedy", 1}})
    ASSERT_TRUE(
        add_replay_line(line(put, setting, k, setting == "under contention" ? 4 : 2), &plan));
  ASSERT_TRUE(add_replay_line(line(mm, "as recorded", 1), &plan));
  ASSERT_TRUE(
      add_replay_line(line(mm, "under the remedy", 0, 2, "no deterministic kernel"), &plan));
  // A replay that gave the recorded bits counts as matching (tensor(5)'s digest: 16 bytes of 5).
  std::string recorded;
  for (int i = 0; i < 16; ++i) recorded += "05";
  nlohmann::json again = nlohmann::json::parse(line(mm, "under contention", 1));
  again["outputs"] = nlohmann::json::array(
      {nlohmann::json::array({recorded}), nlohmann::json::array({"0505"})});
  ASSERT_TRUE(add_replay_line(again.dump(), &plan));
  EXPECT_EQ(plan.rows[mm].series.back().matching_recorded, 1);
  EXPECT_FALSE(add_replay_line("not json", &plan));
  EXPECT_FALSE(add_replay_line(R"({"id": "99", "setting": "x"})", &plan));

  const CoverageReport r = judge_coverage(plan, 8, 300, 12, 1);
  EXPECT_EQ(r.nondeterministic, 1);
  EXPECT_EQ(r.deterministic, 1);
  EXPECT_EQ(r.unverified, 4);
  EXPECT_EQ(r.unknown_to_catalog, 0);
  ASSERT_EQ(r.rows.front().op, "aten::_index_put_impl_");  // nondeterministic first
  EXPECT_EQ(r.rows.front().verdict, Coverage::kNondeterministic);
  EXPECT_EQ(r.rows.front().why.rfind("5 distinct outputs in 8 replays under contention (4 "
                                     "threads, a busy core)",
                                     0),
            0u)
      << r.rows.front().why;
  const OpTypeRow& mm_row = r.rows.back();
  EXPECT_EQ(mm_row.op, "aten::mm");
  EXPECT_EQ(mm_row.verdict, Coverage::kDeterministic);
  EXPECT_NE(mm_row.why.find("identical in 8 replays each: as recorded (2 threads)"),
            std::string::npos);
  EXPECT_NE(mm_row.why.find("under the remedy: the op refused (no deterministic kernel)"),
            std::string::npos);
}

// A loaded machine can run a race's threads in the same order for a whole series: an op the
// catalog lists is replayed more under contention, and its verdict says how many cores its
// threads got.
TEST(CoverageTest, AListedRaceThatNeverShowedIsReplayedMoreAndSaysWhatCoresItsThreadsGot) {
  RunDir run("coverage_suspect");
  CoveragePlan plan = planned(&run);
  for (OpTypeRow& r : plan.rows)
    if (r.unverifiable.empty()) r.capture_status = "saved";
  const size_t put = size_t(row_of(plan, "aten::_index_put_impl_") - plan.rows.data());
  const size_t mm = size_t(row_of(plan, "aten::mm") - plan.rows.data());
  const nlohmann::json manifest = replay_manifest(plan, {put, mm}, 20, 0);
  auto until_differs = [&](size_t op) {
    return manifest["ops"][op]["settings"][1].value("until_differs", -1);
  };
  EXPECT_EQ(manifest["ops"][0]["settings"][1]["setting"], "under contention");
  EXPECT_EQ(until_differs(0), 180);  // listed: up to 200 replays in all
  EXPECT_EQ(until_differs(1), 0);    // mm: not listed
  for (const std::string setting : {"as recorded", "under contention", "under the remedy"}) {
    nlohmann::json j = nlohmann::json::parse(line(put, setting, 1));
    if (setting == "under contention") {
      j["replays"] = 200;
      j["cores_used"] = 1.04;
    }
    ASSERT_TRUE(add_replay_line(j.dump(), &plan));
  }
  const CoverageReport r = judge_coverage(plan, 8, 300, 12, 1);
  const auto row = std::find_if(r.rows.begin(), r.rows.end(), [](const OpTypeRow& x) {
    return x.op == "aten::_index_put_impl_" && !x.series.empty();
  });
  ASSERT_NE(row, r.rows.end());
  EXPECT_EQ(row->verdict, Coverage::kDeterministic);
  EXPECT_EQ(row->series[1].cores_used, 1.04);
  EXPECT_NE(row->why.find("identical in every replay: as recorded (2 threads): 8; under "
                          "contention (2 threads, a busy core): 200, using 1.0 cores"),
            std::string::npos)
      << row->why;
}

TEST(CoverageTest, TheBudgetAndTheCaptureLeaveTypesUnverifiedSayingWhy) {
  RunDir run("coverage_budget");
  CoveragePlan plan = planned(&run);
  const size_t put = size_t(row_of(plan, "aten::_index_put_impl_") - plan.rows.data());
  const size_t mm = size_t(row_of(plan, "aten::mm") - plan.rows.data());
  plan.rows[put].capture_status = "saved";  // but never replayed: the budget ran out
  plan.rows[mm].capture_status = "other-path";
  plan.rows[mm].capture_why = "its inputs differ from the record's";
  RunDir died_run("coverage_died");
  CoveragePlan died = planned(&died_run);
  const size_t died_put = size_t(row_of(died, "aten::_index_put_impl_") - died.rows.data());
  died.rows[died_put].capture_status = "saved";
  ASSERT_TRUE(add_replay_line(line(died_put, "as recorded", 1), &died));
  died.rows[died_put].replay_died = "the replayer died on it (SIGSEGV)";
  for (const OpTypeRow& row : judge_coverage(died, 8, 300, 5, 1).rows) {
    if (row.op == "aten::_index_put_impl_") {
      EXPECT_EQ(row.why, "the replayer died on it (SIGSEGV)");
    }
  }
  const CoverageReport r = judge_coverage(plan, 8, 10, 10.5, 1);
  EXPECT_EQ(r.nondeterministic + r.deterministic, 0);
  for (const OpTypeRow& row : r.rows) {
    if (row.op == "aten::_index_put_impl_") {
      EXPECT_EQ(row.why, "the time budget ran out before its replays");
    } else if (row.op == "aten::mm") {
      EXPECT_EQ(row.why, "not captured (other-path): its inputs differ from the record's");
    }
  }
}

TEST(CoverageTest, EveryFormatHasARowPerTypeAndTheGateCounts) {
  RunDir run("coverage_formats");
  CoveragePlan plan = planned(&run);
  const size_t mm = size_t(row_of(plan, "aten::mm") - plan.rows.data());
  plan.rows[mm].capture_status = "saved";
  ASSERT_TRUE(add_replay_line(line(mm, "under contention", 3), &plan));
  const CoverageReport r = judge_coverage(plan, 8, 300, 2, 2);
  EXPECT_EQ(r.unknown_to_catalog, 1);  // mm: nondeterministic, and no entry says so

  const nlohmann::json j = coverage_to_json(r);
  EXPECT_EQ(j["schema"], "detaudit.coverage/1");
  EXPECT_EQ(j["op_types"].size(), plan.rows.size());
  EXPECT_EQ(j["counts"]["verified_nondeterministic"], 1);
  EXPECT_EQ(j["counts"]["not_in_catalog"], 1);
  EXPECT_EQ(j["op_types"][0]["op"], "aten::mm");
  EXPECT_EQ(j["op_types"][0]["distinct"], 3);

  const std::string text = render_coverage_text(r, false);
  EXPECT_NE(text.find("VERIFIED NONDETERMINISTIC\n  aten::mm [float32, cpu, 2-D, <=2^6] x1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("UNVERIFIED (5)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("catalog: not in the catalog: worth an entry"), std::string::npos);
  const std::string junit = render_coverage_junit(r);
  EXPECT_NE(junit.find("failures=\"1\""), std::string::npos);
  EXPECT_NE(junit.find("skipped=\"5\""), std::string::npos) << junit;
  const std::string md = render_coverage_markdown(r);
  EXPECT_NE(md.find("| verified-nondeterministic | `aten::mm` |"), std::string::npos) << md;
  const std::string html = render_coverage_html(r);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("distinct outputs in 8 replays"), std::string::npos);
}

}  // namespace
}  // namespace detaudit::replay
