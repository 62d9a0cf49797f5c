// configs/catalog.json loads, every entry keeps its sources, remedy and uncertainty, lookups
// and conditions work on recorded ops, and the single-run risk report finds what ran.
#include "catalog/catalog.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include "diff/classify.h"
#include "diff/risk.h"
#include "test_files.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using namespace detaudit::testing;

TEST(CatalogTest, EveryEntryHasSourcesRemedyAndUncertainty) {
  std::ifstream in(shipped_catalog_file());
  nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_GT(j["entries"].size(), 50u);
  for (const auto& e : j["entries"]) {
    SCOPED_TRACE(e.value("id", "?"));
    ASSERT_TRUE(e.contains("sources"));
    EXPECT_FALSE(e["sources"].empty());
    EXPECT_FALSE(e.value("remedy", "").empty());
    EXPECT_TRUE(e.contains("uncertain") && e["uncertain"].is_boolean());
    EXPECT_TRUE(e.contains("uncertainty"));
    EXPECT_TRUE(e.contains("device") && e.contains("phase"));
    EXPECT_TRUE(e.contains("deterministic_alternative"));
    if (e["uncertain"].get<bool>()) {
      EXPECT_FALSE(e["uncertainty"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(shipped_catalog().entries().size(), j["entries"].size());
}

// Whether use_deterministic_algorithms(True) rules a CUDA entry out is stated, never left to a
// default: `exists` is what the report's reader acts on.
TEST(CatalogTest, EveryCudaEntryStatesWhetherDeterministicModeRulesItOut) {
  std::ifstream in(shipped_catalog_file());
  nlohmann::json j = nlohmann::json::parse(in);
  int cuda = 0;
  for (const auto& e : j["entries"]) {
    const auto& devices = e["device"];
    if (std::find(devices.begin(), devices.end(), "cuda") == devices.end()) continue;
    ++cuda;
    SCOPED_TRACE(e.value("id", "?"));
    ASSERT_TRUE(e.contains("deterministic_alternative"));
    const auto& alt = e["deterministic_alternative"];
    ASSERT_TRUE(alt.contains("exists"));
    EXPECT_TRUE(alt["exists"].is_boolean());
  }
  EXPECT_GT(cuda, 40);
}

// Where no deterministic implementation exists, deterministic mode raises on the op (or leaves
// it as it is): a remedy that only says to turn it on sends the user into that error.
TEST(CatalogTest, EntriesWithoutADeterministicAlternativeSayWhatToDoInstead) {
  // Every way the catalog's remedies name deterministic mode.
  const std::regex mode(
      R"(use_deterministic_algorithms\([^)]*\)|setDeterministicAlgorithms\([^)]*\)|\(C\+\+: [^)]*\)|deterministic mode|det\. mode|warn_only=False)");
  std::ifstream in(shipped_catalog_file());
  nlohmann::json j = nlohmann::json::parse(in);
  int without = 0;
  for (const auto& e : j["entries"]) {
    if (e["deterministic_alternative"].value("exists", false)) continue;
    ++without;
    const std::string id = e.value("id", "?"), remedy = e.value("remedy", "");
    SCOPED_TRACE(id + ": " + remedy);
    // Something is left once deterministic mode is taken out.
    const std::string rest = std::regex_replace(remedy, mode, "");
    EXPECT_TRUE(std::any_of(rest.begin(), rest.end(), [](char c) { return std::isalpha(c); }));
    if (e.value("kind", "") != "op") continue;
    // An op's remedy may name deterministic mode only to say that it raises or does nothing.
    size_t begin = 0;
    while (begin <= remedy.size()) {
      size_t end = remedy.find(';', begin);
      if (end == std::string::npos) end = remedy.size();
      const std::string part = remedy.substr(begin, end - begin);
      if (std::regex_search(part, mode) && part.find("raises") == std::string::npos &&
          part.find("neither fixes nor flags") == std::string::npos &&
          part.find("is deterministic in deterministic mode") == std::string::npos)
        ADD_FAILURE() << "recommends deterministic mode: " << part;
      begin = end + 1;
    }
  }
  EXPECT_GT(without, 20);
}

TEST(CatalogTest, CoversEveryRowOfTheReferenceTable) {
  std::set<int> rows;
  for (const CatalogEntry& e : shipped_catalog().entries())
    rows.insert(e.rows.begin(), e.rows.end());
  for (int r = 1; r <= 84; ++r) EXPECT_TRUE(rows.count(r)) << "row " << r;
  for (const char* id :
       {"intra-op-threads", "cublas-workspace", "cudnn-benchmark", "tf32-reduced-precision",
        "nccl-environment", "rng-seeding", "dataloader-workers", "pythonhashseed"})
    EXPECT_NE(shipped_catalog().find(id), nullptr) << id;
}

TEST(CatalogTest, KeyedOnRecordedNames) {
  for (const char* op : {"aten::index_put_", "aten::_index_put_impl_", "aten::scatter_add_",
                         "aten::index_add_", "aten::upsample_bilinear2d_backward",
                         "aten::_adaptive_avg_pool2d_backward", "aten::grid_sampler_2d_backward",
                         "aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward",
                         "torchvision::_roi_align_backward", "IndexBackward0"})
    EXPECT_FALSE(shipped_catalog().lookup(op).empty()) << op;
  EXPECT_TRUE(shipped_catalog().lookup("aten::relu").empty());
}

// An _index_put_impl_(self, indices, values, accumulate, unsafe) record, read back.
struct IndexPutOp {
  trace::TraceReader reader;
  IndexPutOp(const std::string& name, bool accumulate, int64_t n, uint64_t threads) {
    TraceBuilder b;
    b.step(0, 1, threads);
    b.op("aten::_index_put_impl_")
        .in_new(tensor(0, {n}))
        .in_list(1)
        .in_new(tensor(1, {n}, Provenance::kOutput, Dtype::kInt64))
        .in_new(tensor(2, {n}))
        .in_bool(accumulate)
        .in_bool(false)
        .out_new(tensor(3, {n}))
        .done();
    std::string path = std::string(::testing::TempDir()) + "/catalog_" + name + ".dtr";
    RunDir::write(path, b.bytes());
    EXPECT_TRUE(reader.open(path).ok());
    while (reader.next() == trace::ReadResult::kRecord && reader.kind() != trace::RecordKind::kOp) {
    }
  }
  OpFacts facts(uint64_t threads) {
    OpFacts f;
    f.name = "aten::_index_put_impl_";
    f.op = &reader.op();
    f.reader = &reader;
    f.intra_op_threads = threads;
    return f;
  }
};

TEST(CatalogTest, ConditionsAreCheckedAgainstTheRecordedArguments) {
  const CatalogEntry* e = shipped_catalog().find("index-put-accumulate-cpu");
  ASSERT_NE(e, nullptr);
  IndexPutOp hit("hit", true, 65536, 2);
  CatalogMatch m = evaluate(*e, hit.facts(2));
  EXPECT_TRUE(m.applies);
  EXPECT_EQ(m.unmet.size(), 0u);
  EXPECT_GE(m.met.size(), 4u);

  IndexPutOp no_acc("noacc", false, 65536, 2);
  EXPECT_FALSE(evaluate(*e, no_acc.facts(2)).applies);
  IndexPutOp small("small", true, 100, 2);
  EXPECT_FALSE(evaluate(*e, small.facts(2)).applies);
  IndexPutOp one_thread("onethread", true, 65536, 1);
  EXPECT_FALSE(evaluate(*e, one_thread.facts(1)).applies);
  // The CUDA entries do not apply to a CPU op.
  EXPECT_FALSE(
      evaluate(*shipped_catalog().find("index-put-cuda-duplicates"), hit.facts(2)).applies);
}

TEST(CatalogTest, SearchByNameRemedyAndId) {
  auto by_name = shipped_catalog().search("index_put");
  EXPECT_FALSE(by_name.empty());
  EXPECT_FALSE(shipped_catalog().search("CUBLAS_WORKSPACE_CONFIG").empty());
  auto by_id = shipped_catalog().search("grid-sampler-2d-backward-cuda");
  ASSERT_FALSE(by_id.empty());
  EXPECT_EQ(by_id.front()->id, "grid-sampler-2d-backward-cuda");  // exact id first
  EXPECT_LT(by_id.size(), 4u);
  EXPECT_TRUE(shipped_catalog().search("no such thing anywhere").empty());
}

TEST(CatalogTest, BadCatalogsAreRejectedWithTheField) {
  Catalog c;
  Status s = Catalog::parse(nlohmann::json::parse(R"({"entries":[{"id":"x","ops":["a"],
      "remedy":"r","sources":["s"]}]})"),
                            &c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("uncertain"), std::string::npos);
  s = Catalog::parse(nlohmann::json::parse(R"({"entries":[{"id":"x","ops":["a"],"remedy":"r",
      "sources":["s"],"uncertain":false,"conditions":[{"arg":1}]}]})"),
                     &c);
  EXPECT_FALSE(s.ok());
  for (const char* cond : {R"({"environment":"determinism.mkl_vml_warm_up"})",
                           R"({"environment":"k","equals":false,"arg":0})"}) {
    s = Catalog::parse(nlohmann::json::parse(std::string(R"({"entries":[{"id":"x","ops":["a"],
        "remedy":"r","sources":["s"],"uncertain":false,"conditions":[)") +
                                             cond + "]}]}"),
                       &c);
    EXPECT_FALSE(s.ok()) << cond;
    EXPECT_NE(s.message().find("environment condition"), std::string::npos) << s.message();
  }
  EXPECT_EQ(Catalog::load("/nonexistent/catalog.json", &c).code(), ExitCode::kUsage);
}

// Found while writing fuzz_catalog (docs/fuzzing.md): nlohmann's get<int>() of 1e300 is undefined
// behaviour (UBSan: outside the range of int), and a negative threshold wrapped to 2^64 - 1.
TEST(CatalogTest, IntegerFieldsOutOfRangeAreRejectedWithTheField) {
  const char* entry = R"({"id":"x","ops":["a"],"remedy":"r","sources":["s"],"uncertain":false,)";
  for (auto [field, bad] : std::vector<std::pair<std::string, std::string>>{
           {"rows", R"("rows":[1e300])"},
           {"conditions[0].arg", R"("conditions":[{"arg":1e300,"dtype":"float32"}])"},
           {"conditions[0].arg", R"("conditions":[{"arg":4294967296,"dtype":"float32"}])"},
           {"conditions[0].min_numel", R"("conditions":[{"arg":2,"min_numel":1e300}])"},
           {"conditions[0].min_numel", R"("conditions":[{"arg":2,"min_numel":-1}])"},
           {"conditions[0].min_intra_op_threads",
            R"("conditions":[{"min_intra_op_threads":2.5}])"}}) {
    Catalog c;
    std::string text = std::string(R"({"entries":[)") + entry + bad + "}]}";
    Status s = Catalog::parse(nlohmann::json::parse(text), &c);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.code(), ExitCode::kUsage);
    EXPECT_NE(s.message().find("(x)." + field + ": expected an integer"), std::string::npos)
        << s.message();
  }
}

// An in-place unary op on one tensor of this dtype, read back.
struct UnaryOp {
  trace::TraceReader reader;
  UnaryOp(const std::string& name, Dtype dtype) {
    TraceBuilder b;
    b.step(0, 1, 2);
    b.op(name)
        .in_new(tensor(1, {97, 51}, Provenance::kOutput, dtype))
        .out_new(tensor(2, {97, 51}, Provenance::kOutput, dtype))
        .done();
    std::string path = std::string(::testing::TempDir()) + "/catalog_unary_" +
                       std::string(trace::dtype_name(dtype)) + ".dtr";
    RunDir::write(path, b.bytes());
    EXPECT_TRUE(reader.open(path).ok());
    while (reader.next() == trace::ReadResult::kRecord && reader.kind() != trace::RecordKind::kOp) {
    }
  }
  OpFacts facts(std::string_view name, uint64_t threads,
                const std::map<std::string, std::string>* fingerprint = nullptr) {
    OpFacts f;
    f.name = name;
    f.op = &reader.op();
    f.reader = &reader;
    f.intra_op_threads = threads;
    f.fingerprint = fingerprint;
    return f;
  }
};

// oneMKL VML's first-call race: float32 and float64 only (ATen hands no other dtype to VML), and
// only with several intra-op threads to make the first call together.
TEST(CatalogTest, MklVmlFirstCallNeedsFloatOrDoubleOnSeveralThreads) {
  std::vector<const CatalogEntry*> hits = shipped_catalog().lookup("aten::tanh_");
  ASSERT_EQ(hits.size(), 1u);
  const CatalogEntry& e = *hits[0];
  EXPECT_EQ(e.id, "mkl-vml-first-call");
  for (const char* op : {"aten::sqrt", "aten::exp_", "aten::log.out", "aten::erfinv"})
    EXPECT_EQ(shipped_catalog().lookup(op).size(), 1u) << op;
  UnaryOp f64("aten::tanh_", Dtype::kFloat64), f32("aten::tanh_", Dtype::kFloat32),
      f16("aten::tanh_", Dtype::kFloat16);
  EXPECT_TRUE(evaluate(e, f64.facts("aten::tanh_", 2)).applies);
  EXPECT_TRUE(evaluate(e, f32.facts("aten::tanh_", 4)).applies);
  EXPECT_FALSE(evaluate(e, f16.facts("aten::tanh_", 2)).applies);
  EXPECT_FALSE(evaluate(e, f64.facts("aten::tanh_", 1)).applies);

  // The interposer's warm-up, recorded in the fingerprint, rules the race out; a run that did
  // not warm up meets the condition; a fingerprint without the key leaves it unknown.
  const std::map<std::string, std::string> warmed{{"determinism.mkl_vml_warm_up", "true"}},
      cold{{"determinism.mkl_vml_warm_up", "false"}}, older{{"torch_version", "2.13.0"}};
  EXPECT_FALSE(evaluate(e, f64.facts("aten::tanh_", 2, &warmed)).applies);
  CatalogMatch m = evaluate(e, f64.facts("aten::tanh_", 2, &cold));
  EXPECT_TRUE(m.applies);
  EXPECT_NE(
      std::find(m.met.begin(), m.met.end(), "fingerprint determinism.mkl_vml_warm_up == false"),
      m.met.end());
  m = evaluate(e, f64.facts("aten::tanh_", 2, &older));
  EXPECT_TRUE(m.applies);
  ASSERT_EQ(m.unknown.size(), 1u);
  EXPECT_EQ(m.unknown[0], "fingerprint determinism.mkl_vml_warm_up == false");
}

// A kernel torch.compile generated, as hooks/python/ records it: inductor_kernel::<kernel>(str
// origin, Tensor[] inputs) -> Tensor(a!)[].
struct CompiledKernelOp {
  trace::TraceReader reader;
  CompiledKernelOp(const std::string& file, const std::string& origin) {
    TraceBuilder b;
    b.step(0, 1, 2);
    b.op("inductor_kernel::cpp_fused_expand_index_put_mul_new_zeros_0")
        .in_string(origin)
        .in_list(1)
        .in_new(tensor(1, {4096}))
        .out_new(tensor(2, {64, 16}))
        .done();
    std::string path = std::string(::testing::TempDir()) + "/catalog_kernel_" + file + ".dtr";
    RunDir::write(path, b.bytes());
    EXPECT_TRUE(reader.open(path).ok());
    while (reader.next() == trace::ReadResult::kRecord && reader.kind() != trace::RecordKind::kOp) {
    }
  }
  OpFacts facts(uint64_t threads) {
    OpFacts f;
    f.name = "inductor_kernel::cpp_fused_expand_index_put_mul_new_zeros_0";
    f.op = &reader.op();
    f.reader = &reader;
    f.intra_op_threads = threads;
    return f;
  }
};

// Generated kernels are keyed on their namespace ("inductor_kernel::*"), and the entry for the
// CPU's atomic adds needs the origin to say so and more than one thread.
TEST(CatalogTest, CompiledKernelsMatchOnTheirNamespaceAndOrigin) {
  std::vector<const CatalogEntry*> hits = shipped_catalog().lookup(
      "inductor_kernel::cpp_fused_expand_index_put_mul_new_zeros_0");
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_TRUE(shipped_catalog().lookup("inductor_kernels::x").empty());
  EXPECT_TRUE(shipped_catalog().lookup("inductor_kernel").empty());
  const CatalogEntry* e = shipped_catalog().find("inductor-cpu-atomic-add");
  ASSERT_NE(e, nullptr);
  CompiledKernelOp atomic("atomic", "aten::expand, aten::index_put, aten::mul; atomic adds");
  CompiledKernelOp plain("plain", "aten::expand, aten::index_put, aten::mul");
  CatalogMatch m = evaluate(*e, atomic.facts(2));
  EXPECT_TRUE(m.applies);
  EXPECT_NE(std::find(m.met.begin(), m.met.end(), "origin (input 0) contains \"atomic adds\""),
            m.met.end());
  EXPECT_FALSE(evaluate(*e, atomic.facts(1)).applies);
  EXPECT_FALSE(evaluate(*e, plain.facts(2)).applies);
  // The CUDA entry does not apply to a CPU kernel.
  EXPECT_FALSE(
      evaluate(*shipped_catalog().find("inductor-cuda-atomic-add"), atomic.facts(2)).applies);
  // The diff's report names the origin of a generated kernel, and of no other op.
  EXPECT_EQ(kernel_origin(atomic.reader.op(), atomic.reader),
            "aten::expand, aten::index_put, aten::mul; atomic adds");
}

// resize_ is nondeterministic on quantized CPU tensors only: a float buffer's resize_ (every
// out= kernel calls it) must not be flagged.
TEST(CatalogTest, QuantizedResizeNeedsAQuantizedTensor) {
  RunDir run("qresize/run-0");
  TraceBuilder b;
  b.step(0, 1, 2);
  b.op("aten::resize_")
      .in_new(tensor(1, {8}))
      .in_list(1)
      .in_int(16)
      .in_none()
      .out_new(uninitialized(0, {16}))
      .done();
  b.op("aten::resize_")
      .in_skipped("quantized")
      .in_list(1)
      .in_int(16)
      .in_none()
      .out_new(tensor(2, {16}))
      .done();
  b.end();
  run.add_stream("r0.main.t0", b);
  RiskReport r;
  ASSERT_TRUE(risk_report(run.path(), shipped_catalog(), &r).ok());
  const RiskHit* hit = nullptr;
  for (const RiskHit& h : r.hits)
    if (h.entry_id == "quantized-resize-cpu") hit = &h;
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->count, 1u);  // the quantized one only
  bool quantized = false;
  for (const std::string& c : hit->conditions_met)
    quantized |= c.find("quantized") != std::string::npos;
  EXPECT_TRUE(quantized);
}

TEST(RiskTest, ReportsCatalogOpsThatRanWithTheirConditions) {
  RunDir run("risk/run-0");
  TraceBuilder b;
  for (uint64_t k = 0; k < 3; ++k) {
    b.step(k, 1, 2);
    b.op("aten::relu").in_new(tensor(1)).out_new(tensor(2)).done();
    b.op("aten::_index_put_impl_")
        .in_new(tensor(0, {65536}))
        .in_list(1)
        .in_new(tensor(1, {65536}, Provenance::kOutput, Dtype::kInt64))
        .in_new(tensor(2, {65536}))
        .in_bool(k != 2)
        .in_bool(false)
        .out_new(tensor(3, {65536}))
        .done();
  }
  b.end();
  run.add_stream("r0.main.t0", b);
  run.env("r0.main", sample_env(2, 1));
  RiskReport r;
  ASSERT_TRUE(risk_report(run.path(), shipped_catalog(), &r).ok());
  EXPECT_EQ(r.ops_scanned, 6u);
  const RiskHit* hit = nullptr;
  for (const RiskHit& h : r.hits)
    if (h.entry_id == "index-put-accumulate-cpu") hit = &h;
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->count, 2u);  // step 2 ran with accumulate=false
  EXPECT_EQ(hit->op, "aten::_index_put_impl_");
  bool threads = false;
  for (const EnvironmentRisk& e : r.environment) threads |= e.entry_id == "intra-op-threads";
  EXPECT_TRUE(threads);
  std::string text = render_risk_report(r, false);
  EXPECT_NE(text.find("index-put-accumulate-cpu"), std::string::npos);
  EXPECT_EQ(risk_report_to_json(r)["ops"].size(), r.hits.size());
}

}  // namespace
}  // namespace detaudit
