// `run --selftest`'s judgement of a plant and `run --validate`'s of the unrecorded runs
// (src/run/selftest.h, src/run/validate.h): each outcome from a diff report built for it.
#include "run/selftest.h"

#include <gtest/gtest.h>

#include "diff/diff.h"
#include "diff/report_model.h"
#include "report/render.h"
#include "run/validate.h"

namespace detaudit::run {
namespace {

using nlohmann::json;

PlantChoice plant_at(uint64_t step, uint64_t index) {
  PlantChoice p;
  p.phase = p.kind = "optimizer";
  p.op.op = "aten::add_";
  p.op.stream = "r0.main.t-main";
  p.op.step = step;
  p.op.index = index;
  return p;
}

json planted(bool declared = true) {
  return {{"status", "planted"},
          {"value", "output 0"},
          {"declared", declared},
          {"before", 1.0},
          {"after", 1.001}};
}

DiffReport first_at(const std::string& stream, uint64_t step, uint64_t index,
                    const std::string& op) {
  DiffReport r;
  r.verdict = Verdict::kDivergent;
  r.first = FirstDivergence{};
  r.first->stream = stream;
  r.first->step = step;
  r.first->index = index;
  r.first->op = op;
  r.first->phase = "forward";
  return r;
}

TEST(SelfTestTest, FoundAtItsOpAndStep) {
  SelfTest::Plant k = judge_plant(plant_at(3, 40), planted(),
                                  first_at("r0.main.t-main", 3, 40, "aten::add_"));
  EXPECT_EQ(k.outcome, "found");
  EXPECT_EQ(k.seen_at, "r0.main.t-main step 3 forward aten::add_ (op #40)");
}

TEST(SelfTestTest, SeenLaterIsABlindSpotNamedWithWhereItWasSeen) {
  SelfTest::Plant k = judge_plant(plant_at(3, 40), planted(/*declared=*/false),
                                  first_at("r0.main.t-main", 4, 52, "aten::addmm"));
  EXPECT_EQ(k.outcome, "late");
  EXPECT_NE(k.line.find("a blind spot"), std::string::npos) << k.line;
  EXPECT_NE(k.line.find("step 4 forward aten::addmm"), std::string::npos) << k.line;
  EXPECT_NE(k.line.find("schema does not declare"), std::string::npos) << k.line;
  EXPECT_FALSE(SelfTest::fails(k.outcome));
}

TEST(SelfTestTest, NotSeenAtAllFailsTheAudit) {
  DiffReport identical;
  identical.verdict = Verdict::kIdentical;
  SelfTest t;
  t.plants.push_back(judge_plant(plant_at(3, 40), planted(), identical));
  EXPECT_EQ(t.plants[0].outcome, "not-found");
  summarize(&t);
  EXPECT_FALSE(t.passed);
  DiffReport r = identical;
  r.selftest = t;
  EXPECT_EQ(gate_exit_code(r), ExitCode::kUnexplained);
  EXPECT_EQ(report_to_json(r)["selftest"]["plants"][0]["outcome"], "not-found");
}

TEST(SelfTestTest, ADivergenceBeforeThePlantIsNotJudged) {
  // Another stream at an earlier step, and the same stream earlier in the step.
  for (const DiffReport& r : {first_at("r1.main.t-main", 2, 90, "aten::mul"),
                              first_at("r0.main.t-main", 3, 12, "aten::mul")})
    EXPECT_EQ(judge_plant(plant_at(3, 40), planted(), r).outcome, "preceded");
}

TEST(SelfTestTest, AnOpNotReachedOrWithNothingToChange) {
  const DiffReport r = first_at("r0.main.t-main", 3, 40, "aten::add_");
  EXPECT_EQ(judge_plant(plant_at(3, 40), nullptr, r).outcome, "not-reached");
  SelfTest::Plant k = judge_plant(
      plant_at(3, 40), {{"status", "nothing-to-change"}, {"why", "it made no tensor"}}, r);
  EXPECT_EQ(k.outcome, "not-planted");
  EXPECT_FALSE(SelfTest::fails(k.outcome));
  // Nothing planted at all proves nothing: failed closed.
  SelfTest t;
  t.plants.push_back(k);
  summarize(&t);
  EXPECT_FALSE(t.passed);
}

TEST(SelfTestTest, AllFoundPassesAndTheGateKeepsTheVerdict) {
  SelfTest t;
  t.plants.push_back(
      judge_plant(plant_at(3, 40), planted(), first_at("r0.main.t-main", 3, 40, "aten::add_")));
  t.plants.push_back(
      judge_plant(plant_at(3, 40), planted(), first_at("r0.main.t-main", 4, 41, "aten::addmm")));
  summarize(&t);
  EXPECT_TRUE(t.passed);
  EXPECT_EQ(t.outcome, "1 of 2 plants found at their op, 1 late (a blind spot, named)");
  DiffReport r;
  r.verdict = Verdict::kIdentical;
  r.selftest = t;
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
}

json state(const std::string& digest, int optimizers = 1) {
  return {
      {"rank", 0},
      {"optimizers", optimizers},
      {"tensors",
       json::array({{{"name", "optimizer 0 SGD.param_groups[0].params[0]"}, {"sha256", digest}}})}};
}

TEST(ValidateTest, RecordingHidTheDivergence) {
  Validation v;
  std::string why;
  compare_final_states({state("aa")}, {state("bb")}, &v, &why);
  ASSERT_TRUE(v.compared);
  EXPECT_FALSE(v.identical);
  EXPECT_EQ(v.difference, "rank 0 optimizer 0 SGD.param_groups[0].params[0]");
  DiffReport recorded;
  recorded.verdict = Verdict::kIdentical;
  judge_validation(recorded, why, &v);
  EXPECT_TRUE(v.hidden && v.failed);
  recorded.validation = v;
  EXPECT_EQ(gate_exit_code(recorded), ExitCode::kUnexplained);
}

TEST(ValidateTest, AgreeingRunsValidateAndDivergentOnesDoNotHide) {
  Validation same;
  std::string why;
  compare_final_states({state("aa")}, {state("aa")}, &same, &why);
  DiffReport recorded;
  recorded.verdict = Verdict::kIdentical;
  judge_validation(recorded, why, &same);
  EXPECT_FALSE(same.failed);
  EXPECT_EQ(same.outcome, "validated: the runs without recording leave the same 1 tensors");
  // Recorded divergent and unrecorded divergent: the verdict stands, nothing was hidden.
  Validation differ;
  compare_final_states({state("aa")}, {state("bb")}, &differ, &why);
  DiffReport divergent = first_at("r0.main.t-main", 1, 2, "aten::mm");
  judge_validation(divergent, why, &differ);
  EXPECT_FALSE(differ.hidden || differ.failed);
}

TEST(ValidateTest, NothingToCompareIsNotValidated) {
  Validation v;
  std::string why;
  compare_final_states({}, {state("aa")}, &v, &why);
  EXPECT_FALSE(v.compared);
  DiffReport recorded;
  recorded.verdict = Verdict::kIdentical;
  judge_validation(recorded, why, &v);
  EXPECT_TRUE(v.failed);
  EXPECT_NE(v.outcome.find("NOT VALIDATED"), std::string::npos);
  Validation none;
  compare_final_states({state("aa", 0)}, {state("aa", 0)}, &none, &why);
  EXPECT_FALSE(none.compared);
  EXPECT_EQ(why, "the program had no torch.optim optimizer at exit");
}

}  // namespace
}  // namespace detaudit::run
