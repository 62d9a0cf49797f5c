// A first divergence's remedy as run's own settings (src/run/remedy.h).
#include "run/remedy.h"

#include <gtest/gtest.h>

#include "catalog/catalog.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "report/render.h"

namespace detaudit::run {
namespace {

FirstDivergence divergence(DivergenceClass cls) {
  FirstDivergence f;
  f.divergence_class = cls;
  f.op = "aten::_index_put_impl_";
  f.explanation.remedy = "initialise it";
  return f;
}

TEST(RemedyTest, AKernelRaceIsDeterministicMode) {
  std::string why;
  RemedySettings s = remedy_settings(divergence(DivergenceClass::kNondeterministicOp), nullptr,
                                     &why);
  EXPECT_EQ(s.flags(), "--deterministic on");
  EXPECT_TRUE(why.empty());
  Config c;
  s.apply(&c);
  EXPECT_EQ(c.determinism.algorithms, "on");
}

TEST(RemedyTest, CatalogEntriesNameTheirSettings) {
  Catalog catalog;
  ASSERT_TRUE(
      Catalog::load(std::string(DETAUDIT_SOURCE_DIR) + "/configs/catalog.json", &catalog).ok());
  auto for_entry = [&](const std::string& id) {
    FirstDivergence f = divergence(DivergenceClass::kNondeterministicOp);
    f.explanation.catalog = CatalogRef{};
    f.explanation.catalog->id = id;
    std::string why;
    return remedy_settings(f, &catalog, &why).flags();
  };
  EXPECT_EQ(for_entry("cublas-workspace"),
            "--deterministic on --env CUBLAS_WORKSPACE_CONFIG=:4096:8");
  EXPECT_EQ(for_entry("mkl-cnr"), "--threads 1 --env MKL_CBWR=AUTO");
  EXPECT_EQ(for_entry("cudnn-rnn"), "");  // a CUDA kernel with no deterministic path
  EXPECT_EQ(for_entry("sparse-bmm-cuda"), "--deterministic on");
}

TEST(RemedyTest, RandomStateIsASeedAndDataOrderAHashSeed) {
  std::string why;
  EXPECT_EQ(remedy_settings(divergence(DivergenceClass::kRngState), nullptr, &why).flags(),
            "--seed 0");
  FirstDivergence order = divergence(DivergenceClass::kExternalInput);
  order.evidence.hash_seed_unset = true;
  RemedySettings s = remedy_settings(order, nullptr, &why);
  EXPECT_EQ(s.flags(), "--env PYTHONHASHSEED=0");
  Config c;
  s.apply(&c);
  EXPECT_EQ(c.target.env.at("PYTHONHASHSEED"), "0");
}

TEST(RemedyTest, AProgramChangeHasNoSettingsAndSaysWhy) {
  std::string why;
  EXPECT_TRUE(
      remedy_settings(divergence(DivergenceClass::kUninitializedMemory), nullptr, &why).empty());
  EXPECT_NE(why.find("initialise it"), std::string::npos) << why;
}

TEST(RemedyTest, MergingTheSameRemedyAddsNothing) {
  RemedySettings a, b;
  b.deterministic = "on";
  EXPECT_TRUE(a.merge(b));
  EXPECT_FALSE(a.merge(b));
  RemedySettings c;
  c.threads = 1;
  EXPECT_TRUE(a.merge(c));
  EXPECT_EQ(a.flags(), "--deterministic on --threads 1");
}

TEST(RemedyTest, EveryReportFormatCarriesTheVerification) {
  DiffReport r;
  r.verdict = Verdict::kDivergent;
  RemedyVerification v;
  v.verified = false;
  v.outcome = "NOT verified: with --deterministic on the runs still diverge";
  v.rounds.push_back({1, "--deterministic on", "audit/remedy-1", Verdict::kDivergent,
                      "r0.main.t-main step 0 aten::mm (nondeterministic-op)"});
  r.remedy_verification = v;
  for (ReportFormat f : {ReportFormat::kText, ReportFormat::kMarkdown, ReportFormat::kHtml,
                         ReportFormat::kJunit, ReportFormat::kJson}) {
    const std::string out = render_report(r, f, false);
    EXPECT_NE(out.find("NOT verified"), std::string::npos) << out;
    EXPECT_NE(out.find("--deterministic on"), std::string::npos) << out;
  }
  // JUnit: a remedy that did not work is a failing case.
  EXPECT_NE(render_report(r, ReportFormat::kJunit, false).find("name=\"remedy\"><failure"),
            std::string::npos);
}

}  // namespace
}  // namespace detaudit::run
