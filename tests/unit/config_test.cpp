// The config: every field parses, every error names its field, and the resolved JSON round-trips.
#include "config/config.h"

#include <gtest/gtest.h>

#include <fstream>

namespace detaudit {
namespace {

using nlohmann::json;

Config parse_ok(const char* text) {
  Config c;
  Status s = parse_config(json::parse(text), &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

// Parses `text`, expects failure with kUsage and a message naming `field`.
std::string parse_error(const char* text, const std::string& field) {
  Config c;
  Status s = parse_config(json::parse(text), &c);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_NE(s.message().find("field \"" + field + "\""), std::string::npos)
      << "message: " << s.message() << "\nexpected field: " << field;
  return s.message();
}

TEST(ConfigTest, DefaultsWhenEmpty) {
  Config c = parse_ok("{}");
  EXPECT_EQ(c.runs, 1);
  EXPECT_EQ(c.out, "audit");
  EXPECT_TRUE(c.select.steps.all());
  EXPECT_TRUE(c.select.ranks.all());
  EXPECT_EQ(c.digest, trace::DigestAlgo::kMd5);
  EXPECT_TRUE(c.stats);
  EXPECT_TRUE(c.inputs);
  EXPECT_FALSE(c.determinism.seed);
  EXPECT_EQ(c.determinism.algorithms, "");
  EXPECT_FALSE(c.determinism.intra_op_threads);
  EXPECT_TRUE(c.determinism.mkl_vml_warm_up);
  EXPECT_EQ(c.gate.fail_on, "any");
  EXPECT_EQ(c.format, "text");
  EXPECT_EQ(c.output, "");
}

TEST(ConfigTest, Target) {
  Config c = parse_ok(R"({"target": {"command": ["/usr/bin/python3", "train.py", "--steps", "3"],
                                     "env": {"OMP_NUM_THREADS": "2"}, "cwd": "/tmp"}})");
  EXPECT_EQ(c.target.command,
            (std::vector<std::string>{"/usr/bin/python3", "train.py", "--steps", "3"}));
  EXPECT_EQ(c.target.env.at("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(c.target.cwd, "/tmp");
}

TEST(ConfigTest, TargetErrors) {
  parse_error(R"({"target": []})", "target");
  parse_error(R"({"target": {"command": "python3 train.py"}})", "target.command");
  parse_error(R"({"target": {"command": ["python3", 3]}})", "target.command[1]");
  parse_error(R"({"target": {"command": [""]}})", "target.command[0]");
  parse_error(R"({"target": {"env": ["A=1"]}})", "target.env");
  parse_error(R"({"target": {"env": {"A": 1}}})", "target.env.A");
  parse_error(R"({"target": {"env": {"A=B": "1"}}})", "target.env.A=B");
  parse_error(R"({"target": {"cwd": 1}})", "target.cwd");
  parse_error(R"({"target": {"argv": []}})", "target.argv");
}

TEST(ConfigTest, RunsAndOut) {
  Config c = parse_ok(R"({"runs": 3, "out": "results/x"})");
  EXPECT_EQ(c.runs, 3);
  EXPECT_EQ(c.out, "results/x");
  parse_error(R"({"runs": 0})", "runs");
  parse_error(R"({"runs": "2"})", "runs");
  parse_error(R"({"runs": 2.5})", "runs");
  parse_error(R"({"out": ""})", "out");
  parse_error(R"({"out": 5})", "out");
}

TEST(ConfigTest, StepsListsRangesAndAll) {
  Config c = parse_ok(R"({"select": {"steps": [0, "2-4", "9-"]}})");
  const RangeSet& s = c.select.steps;
  EXPECT_FALSE(s.all());
  EXPECT_TRUE(s.contains(0));
  EXPECT_FALSE(s.contains(1));
  EXPECT_TRUE(s.contains(2));
  EXPECT_TRUE(s.contains(4));
  EXPECT_FALSE(s.contains(5));
  EXPECT_TRUE(s.contains(9));
  EXPECT_TRUE(s.contains(1000000));
  EXPECT_EQ(s.max_bound(), UINT64_MAX);

  c = parse_ok(R"({"select": {"steps": "0-3"}})");
  EXPECT_TRUE(c.select.steps.contains(3));
  EXPECT_FALSE(c.select.steps.contains(4));
  EXPECT_EQ(c.select.steps.max_bound(), 3u);
  c = parse_ok(R"({"select": {"steps": 7}})");
  EXPECT_TRUE(c.select.steps.contains(7));
  EXPECT_FALSE(c.select.steps.contains(6));
  c = parse_ok(R"({"select": {"steps": ["5"]}})");
  EXPECT_TRUE(c.select.steps.contains(5));
  c = parse_ok(R"({"select": {"steps": "all"}})");
  EXPECT_TRUE(c.select.steps.all());
  EXPECT_TRUE(c.select.steps.contains(123));
}

TEST(ConfigTest, StepsErrorsNameTheElement) {
  std::string m = parse_error(R"({"select": {"steps": [0, "x"]}})", "select.steps[1]");
  EXPECT_NE(m.find("expected an integer or a range like \"0-3\""), std::string::npos) << m;
  parse_error(R"({"select": {"steps": [0, -1]}})", "select.steps[1]");
  parse_error(R"({"select": {"steps": [0, 1.5]}})", "select.steps[1]");
  parse_error(R"({"select": {"steps": ["4-2"]}})", "select.steps[0]");
  parse_error(R"({"select": {"steps": ["-3"]}})", "select.steps[0]");
  parse_error(R"({"select": {"steps": ["1-2-3"]}})", "select.steps[0]");
  parse_error(R"({"select": {"steps": []}})", "select.steps");
  parse_error(R"({"select": {"steps": true}})", "select.steps");
  parse_error(R"({"select": {"steps": "some"}})", "select.steps");
}

TEST(ConfigTest, Ranks) {
  Config c = parse_ok(R"({"select": {"ranks": [0, "2-3"]}})");
  EXPECT_TRUE(c.select.ranks.contains(0));
  EXPECT_FALSE(c.select.ranks.contains(1));
  EXPECT_TRUE(c.select.ranks.contains(3));
  parse_error(R"({"select": {"ranks": ["a"]}})", "select.ranks[0]");
}

TEST(ConfigTest, OpsIncludeExcludeGlobs) {
  Config c = parse_ok(R"({"select": {"ops": {"include": ["aten::*mm*", "aten::add?"],
                                             "exclude": ["aten::addmm"]}}})");
  EXPECT_TRUE(c.select.wants_op("aten::mm"));
  EXPECT_TRUE(c.select.wants_op("aten::bmm"));
  EXPECT_TRUE(c.select.wants_op("aten::add_"));
  EXPECT_FALSE(c.select.wants_op("aten::add"));
  EXPECT_FALSE(c.select.wants_op("aten::addmm"));
  EXPECT_FALSE(c.select.wants_op("aten::relu"));
  c = parse_ok(R"({"select": {"ops": {"exclude": ["aten::view", "aten::as_strided"]}}})");
  EXPECT_TRUE(c.select.wants_op("aten::relu"));
  EXPECT_FALSE(c.select.wants_op("aten::view"));
  parse_error(R"({"select": {"ops": ["aten::mm"]}})", "select.ops");
  parse_error(R"({"select": {"ops": {"include": "aten::mm"}}})", "select.ops.include");
  parse_error(R"({"select": {"ops": {"exclude": [1]}}})", "select.ops.exclude[0]");
  parse_error(R"({"select": {"ops": {"only": []}}})", "select.ops.only");
}

TEST(ConfigTest, Globs) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("aten::*", "aten::add"));
  EXPECT_TRUE(glob_match("*::add", "aten::add"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_FALSE(glob_match("aten::add", "aten::add_"));
}

TEST(ConfigTest, Phases) {
  Config c = parse_ok(R"({"select": {"phases": ["forward", "optimizer"]}})");
  EXPECT_TRUE(c.select.wants_phase(trace::Phase::kForward));
  EXPECT_FALSE(c.select.wants_phase(trace::Phase::kBackward));
  EXPECT_TRUE(c.select.wants_phase(trace::Phase::kOptimizer));
  c = parse_ok(R"({"select": {"phases": "all"}})");
  EXPECT_TRUE(c.select.wants_phase(trace::Phase::kBackward));
  std::string m = parse_error(R"({"select": {"phases": ["forward", "sideways"]}})",
                              "select.phases[1]");
  EXPECT_NE(m.find("sideways"), std::string::npos);
  parse_error(R"({"select": {"phases": []}})", "select.phases");
  parse_error(R"({"select": {"phases": "forward"}})", "select.phases");
  parse_error(R"({"select": {"stepz": 1}})", "select.stepz");
}

TEST(ConfigTest, Digest) {
  EXPECT_EQ(parse_ok(R"({"digest": "sha256"})").digest, trace::DigestAlgo::kSha256);
  EXPECT_EQ(parse_ok(R"({"digest": "xxh3"})").digest, trace::DigestAlgo::kXxh3);
  EXPECT_EQ(parse_ok(R"({"digest": "md5"})").digest, trace::DigestAlgo::kMd5);
  EXPECT_EQ(parse_ok(R"({"digest": "device"})").digest, trace::DigestAlgo::kDevice);
  // Named: `detaudit run` picks no default over it (run::default_digest).
  EXPECT_TRUE(parse_ok(R"({"digest": "md5"})").digest_chosen);
  EXPECT_FALSE(parse_ok(R"({"runs": 2})").digest_chosen);
  std::string m = parse_error(R"({"digest": "crc32"})", "digest");
  EXPECT_NE(m.find("\"md5\", \"sha256\", \"xxh3\""), std::string::npos) << m;
  parse_error(R"({"digest": 1})", "digest");
}

TEST(ConfigTest, Record) {
  Config c = parse_ok(R"({"record": {"stats": false, "inputs": false}})");
  EXPECT_FALSE(c.stats);
  EXPECT_FALSE(c.inputs);
  parse_error(R"({"record": {"stats": "no"}})", "record.stats");
  parse_error(R"({"record": {"inputs": 0}})", "record.inputs");
  parse_error(R"({"record": {"outputs": true}})", "record.outputs");
  parse_error(R"({"record": true})", "record");
  EXPECT_EQ(parse_ok("{}").device_batch_mib, 256);
  EXPECT_EQ(parse_ok(R"({"record": {"device_batch_mib": 0}})").device_batch_mib, 0);
  parse_error(R"({"record": {"device_batch_mib": -1}})", "record.device_batch_mib");
  parse_error(R"({"record": {"device_batch_mib": "64"}})", "record.device_batch_mib");
  EXPECT_TRUE(parse_ok("{}").compiled_kernels);
  EXPECT_FALSE(parse_ok(R"({"record": {"compiled_kernels": false}})").compiled_kernels);
  parse_error(R"({"record": {"compiled_kernels": 1}})", "record.compiled_kernels");
  EXPECT_FALSE(parse_ok("{}").sentinel);
  EXPECT_TRUE(parse_ok(R"({"record": {"sentinel": true}})").sentinel);
  parse_error(R"({"record": {"sentinel": 1}})", "record.sentinel");
}

TEST(ConfigTest, Determinism) {
  Config c = parse_ok(R"({"determinism": {"seed": 1234, "algorithms": "warn",
                                          "intra_op_threads": 2}})");
  EXPECT_EQ(*c.determinism.seed, 1234u);
  EXPECT_EQ(c.determinism.algorithms, "warn");
  EXPECT_EQ(*c.determinism.intra_op_threads, 2);
  c = parse_ok(R"({"determinism": {"seed": 18446744073709551615}})");
  EXPECT_EQ(*c.determinism.seed, UINT64_MAX);
  c = parse_ok(R"({"determinism": {"seed": null, "algorithms": null, "intra_op_threads": null}})");
  EXPECT_FALSE(c.determinism.seed);
  parse_error(R"({"determinism": {"seed": -1}})", "determinism.seed");
  parse_error(R"({"determinism": {"seed": "42"}})", "determinism.seed");
  parse_error(R"({"determinism": {"algorithms": "strict"}})", "determinism.algorithms");
  parse_error(R"({"determinism": {"algorithms": true}})", "determinism.algorithms");
  parse_error(R"({"determinism": {"intra_op_threads": 0}})", "determinism.intra_op_threads");
  parse_error(R"({"determinism": {"intra_op_threads": "2"}})", "determinism.intra_op_threads");
  parse_error(R"({"determinism": {"cudnn": true}})", "determinism.cudnn");
  EXPECT_FALSE(
      parse_ok(R"({"determinism": {"mkl_vml_warm_up": false}})").determinism.mkl_vml_warm_up);
  parse_error(R"({"determinism": {"mkl_vml_warm_up": "no"}})", "determinism.mkl_vml_warm_up");
}

TEST(ConfigTest, Gate) {
  Config c = parse_ok(R"({"gate": {"fail_on": "tolerance", "rtol": 1e-5, "atol": 0}})");
  EXPECT_EQ(c.gate.fail_on, "tolerance");
  EXPECT_DOUBLE_EQ(c.gate.rtol, 1e-5);
  EXPECT_DOUBLE_EQ(c.gate.atol, 0);
  parse_error(R"({"gate": {"fail_on": "some"}})", "gate.fail_on");
  parse_error(R"({"gate": {"rtol": -1}})", "gate.rtol");
  parse_error(R"({"gate": {"atol": "1e-3"}})", "gate.atol");
  parse_error(R"({"gate": {"tol": 1}})", "gate.tol");
}

TEST(ConfigTest, Report) {
  Config c = parse_ok(R"({"report": {"format": "junit", "output": "report.xml"}})");
  EXPECT_EQ(c.format, "junit");
  EXPECT_EQ(c.output, "report.xml");
  for (const char* f : {"text", "json", "junit", "markdown", "html"}) {
    json j = {{"report", {{"format", f}}}};
    Config d;
    EXPECT_TRUE(parse_config(j, &d).ok()) << f;
  }
  parse_error(R"({"report": {"format": "pdf"}})", "report.format");
  parse_error(R"({"report": {"output": false}})", "report.output");
  parse_error(R"({"report": {"path": "x"}})", "report.path");
}

TEST(ConfigTest, UnknownTopLevelFieldIsNamed) {
  std::string m = parse_error(R"({"runz": 2})", "runz");
  EXPECT_NE(m.find("unknown field"), std::string::npos);
  EXPECT_NE(m.find("runs"), std::string::npos) << "lists the known fields: " << m;
  parse_error(R"([1, 2])", "<top level>");
}

TEST(ConfigTest, FailedParseLeavesConfigUnchanged) {
  Config c;
  c.runs = 5;
  EXPECT_FALSE(parse_config(json::parse(R"({"runs": 2, "digest": "bad"})"), &c).ok());
  EXPECT_EQ(c.runs, 5);
}

TEST(ConfigTest, RoundTripsThroughResolvedJson) {
  Config c = parse_ok(R"({
    "target": {"command": ["/usr/bin/python3", "t.py"], "env": {"A": "1"}, "cwd": "w"},
    "runs": 4, "out": "o",
    "select": {"steps": [1, "3-5", "8-"], "ops": {"include": ["aten::*"], "exclude": ["aten::view"]},
               "phases": ["backward"], "ranks": [0]},
    "digest": "xxh3", "record": {"stats": false, "inputs": true, "sentinel": true},
    "determinism": {"seed": 7, "algorithms": "on", "intra_op_threads": 3, "mkl_vml_warm_up": false},
    "gate": {"fail_on": "tolerance", "rtol": 0.001, "atol": 1e-6},
    "report": {"format": "markdown", "output": "r.md"}})");
  json j = config_to_json(c);
  Config d;
  Status s = parse_config(j, &d);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(config_to_json(d), j);
  EXPECT_EQ(d.target.command, c.target.command);
  EXPECT_EQ(d.runs, 4);
  EXPECT_TRUE(d.select.steps.contains(4));
  EXPECT_FALSE(d.select.steps.contains(6));
  EXPECT_TRUE(d.select.steps.contains(99));
  EXPECT_EQ(d.select.phases, std::vector<trace::Phase>{trace::Phase::kBackward});
  EXPECT_EQ(d.digest, trace::DigestAlgo::kXxh3);
  EXPECT_FALSE(d.stats);
  EXPECT_TRUE(d.sentinel);
  EXPECT_EQ(*d.determinism.seed, 7u);
  EXPECT_EQ(d.gate.rtol, 0.001);
  EXPECT_EQ(d.format, "markdown");

  // Defaults round-trip too (unset seed and threads are written as null).
  Config e;
  Config f;
  ASSERT_TRUE(parse_config(config_to_json(e), &f).ok());
  EXPECT_EQ(config_to_json(f), config_to_json(e));
  EXPECT_TRUE(config_to_json(e)["determinism"]["seed"].is_null());
}

TEST(ConfigTest, LoadConfigPrefixesTheFileName) {
  std::string path = std::string(::testing::TempDir()) + "/config.json";
  std::ofstream(path) << R"({"select": {"steps": [0, "x"]}})";
  Config c;
  Status s = load_config(path, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), path +
                             ": field \"select.steps[1]\": expected an integer or a range "
                             "like \"0-3\", got \"x\"");
  std::ofstream(path) << "{\"runs\": ";
  s = load_config(path, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not valid JSON"), std::string::npos) << s.message();
  s = load_config(path + ".missing", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
}

// Found by fuzz_config (docs/fuzzing.md): nlohmann reports a number beyond double's range as
// out_of_range, not parse_error, and the exception escaped load_config.
TEST(ConfigTest, LoadConfigNumberOutOfRangeIsAnErrorNotAnException) {
  std::string path = std::string(::testing::TempDir()) + "/config_1e999.json";
  std::ofstream(path) << R"({"gate": {"rtol": 1e999}})";
  Config c;
  Status s;
  ASSERT_NO_THROW(s = load_config(path, &c));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_EQ(s.message().rfind(path + ": not valid JSON", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("1e999"), std::string::npos) << s.message();
}

TEST(ConfigTest, ExampleConfigsParse) {
  for (const char* name : {"minimal.json", "full.json", "nondeterminism.json"}) {
    Config c;
    std::string path = std::string(DETAUDIT_SOURCE_DIR) + "/configs/examples/" + name;
    Status s = load_config(path, &c);
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

}  // namespace
}  // namespace detaudit
