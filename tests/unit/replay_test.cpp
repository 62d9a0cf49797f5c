// The replay's judgement, from series as the replayer reports them (src/replay/replay.h).
#include "replay/replay.h"

#include <gtest/gtest.h>

namespace detaudit::replay {
namespace {

nlohmann::json series(int distinct, bool deterministic, const std::string& error = "") {
  nlohmann::json outputs = nlohmann::json::array();
  for (int i = 0; i < 4; ++i)
    outputs.push_back({i < distinct ? "o" + std::to_string(i) : std::string("o0")});
  nlohmann::json j = {{"replays", 4},
                      {"threads", 2},
                      {"deterministic", deterministic},
                      {"busy_thread", false},
                      {"distinct", distinct},
                      {"max_abs_diff", distinct > 1 ? 1e-9 : 0.0},
                      {"input_digests", {"aa"}},
                      {"outputs", outputs}};
  if (!error.empty()) j["error"] = error;
  return j;
}

ReplayReport saved() {
  ReplayReport r;
  r.target.op = "aten::_index_put_impl_";
  r.target.inputs = {"aa"};
  r.target.recorded_outputs = {"o0"};
  r.capture_status = "saved";
  return r;
}

TEST(ReplayTest, OpRefParses) {
  std::string stream;
  uint64_t index = 0;
  ASSERT_TRUE(parse_op_ref("r1.main.t-main:51", &stream, &index).ok());
  EXPECT_EQ(stream, "r1.main.t-main");
  EXPECT_EQ(index, 51u);
  EXPECT_FALSE(parse_op_ref("r1.main.t-main", &stream, &index).ok());
  EXPECT_FALSE(parse_op_ref("r1.main.t-main:5x", &stream, &index).ok());
  EXPECT_FALSE(parse_op_ref(":5", &stream, &index).ok());
}

TEST(ReplayTest, DistinctOutputsAreReproducedAndTheRemedyVerified) {
  ReplayReport r = saved();
  ASSERT_TRUE(add_series("as recorded", series(3, false), &r).ok());
  ASSERT_TRUE(add_series("under the remedy", series(1, true), &r).ok());
  judge(&r);
  EXPECT_TRUE(r.inputs_match);
  EXPECT_EQ(r.evidence, "verified-nondeterministic");
  EXPECT_EQ(r.evidence_line.rfind("reproduced: 3 distinct outputs in 4 replays as recorded", 0), 0u)
      << r.evidence_line;
  EXPECT_EQ(r.remedy_line.rfind("remedy verified in isolation: 4 of 4 identical", 0), 0u)
      << r.remedy_line;
  EXPECT_EQ(r.series[0].matching_recorded, 2);  // o0, o1, o2, o0
}

TEST(ReplayTest, OneOutputIsNotReproducedAndNamesWhy) {
  ReplayReport r = saved();
  ASSERT_TRUE(add_series("as recorded", series(1, false), &r).ok());
  ASSERT_TRUE(add_series("under contention", series(1, false), &r).ok());
  judge(&r);
  EXPECT_EQ(r.evidence, "not-reproduced");
  EXPECT_NE(r.evidence_line.find("8 replays"), std::string::npos) << r.evidence_line;
  EXPECT_NE(r.evidence_line.find("first-call race"), std::string::npos);
}

TEST(ReplayTest, InputsOtherThanRecordedAreUnverified) {
  ReplayReport r = saved();
  r.target.inputs = {"bb"};
  ASSERT_TRUE(add_series("as recorded", series(3, false), &r).ok());
  judge(&r);
  EXPECT_FALSE(r.inputs_match);
  EXPECT_EQ(r.evidence, "unverified");
}

TEST(ReplayTest, ARemedyTheOpRefusesIsSaid) {
  ReplayReport r = saved();
  ASSERT_TRUE(add_series("as recorded", series(2, false), &r).ok());
  ASSERT_TRUE(
      add_series("under the remedy", series(0, true, "no deterministic implementation"), &r).ok());
  judge(&r);
  EXPECT_EQ(r.remedy_line.rfind("remedy not verified", 0), 0u) << r.remedy_line;
}

TEST(ReplayTest, NotCapturedIsUnverifiedWithTheReason) {
  ReplayReport r;
  r.capture_status = "other-path";
  r.capture_why = "its inputs differ from the record's";
  judge(&r);
  EXPECT_EQ(r.evidence, "unverified");
  EXPECT_NE(r.evidence_line.find("other-path"), std::string::npos);
}

TEST(ReplayTest, OnlyAnotherPathIsWorthAnotherRun) {
  ReplayReport r;
  for (const char* status : {"other-path", "not-reached"}) {
    r.capture_status = status;
    EXPECT_TRUE(capture_may_succeed_again(r)) << status;
  }
  // A generator, an unwritable file: the same on every run.
  for (const char* status : {"saved", "unsupported", "error"}) {
    r.capture_status = status;
    EXPECT_FALSE(capture_may_succeed_again(r)) << status;
  }
  r.capture_status = "other-path";
  r.capture_runs = 3;
  judge(&r);
  EXPECT_NE(r.evidence_line.find("(other-path in 3 new runs)"), std::string::npos)
      << r.evidence_line;
  EXPECT_EQ(report_to_json(r)["capture"]["runs"], 3);
}

}  // namespace
}  // namespace detaudit::replay

namespace detaudit::replay {
namespace {

TEST(ReplayTest, EveryFormatCarriesTheEvidenceAndTheRemedy) {
  ReplayReport r = saved();
  ASSERT_TRUE(add_series("as recorded", series(3, false), &r).ok());
  ASSERT_TRUE(add_series("under the remedy", series(1, true), &r).ok());
  judge(&r);
  for (const std::string& out : {render_text(r), render_markdown(r), render_junit(r),
                                 render_html(r), report_to_json(r).dump()}) {
    EXPECT_NE(out.find("reproduced: 3 distinct outputs"), std::string::npos) << out;
    EXPECT_NE(out.find("remedy verified in isolation"), std::string::npos) << out;
  }
  // JUnit: verified nondeterminism fails the evidence case; the verified remedy passes.
  const std::string junit = render_junit(r);
  EXPECT_NE(junit.find("name=\"evidence\"><failure"), std::string::npos) << junit;
  EXPECT_NE(junit.find("failures=\"1\""), std::string::npos) << junit;
}

}  // namespace
}  // namespace detaudit::replay
