// The launcher keeps the target's output, its exit status and its death by signal; run
// directories, flags and the target's environment follow docs/config.md.
#include "run/launcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "run/compile_cache.h"
#include "run/session.h"
#include "run_layout.h"
#include "test_files.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;

std::string launcher_dir(const std::string& name) {
  return detaudit::testing::fresh_temp_dir("launcher_" + name);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(LauncherTest, CopiesOutputAndKeepsExitCode) {
  std::string dir = launcher_dir("exit");
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"};
  spec.env = current_environment();
  spec.log_path = dir + "/output.log";
  spec.echo = false;
  LaunchResult r;
  Status s = launch_and_wait(spec, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.succeeded());
  EXPECT_EQ(r.describe(), "exit code 3");
  std::string log = read_file(spec.log_path);
  EXPECT_NE(log.find("out\n"), std::string::npos) << log;
  EXPECT_NE(log.find("err\n"), std::string::npos) << log;
  EXPECT_FALSE(r.start_time.empty());
}

TEST(LauncherTest, SignalKilledChild) {
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "kill -KILL $$"};
  spec.env = current_environment();
  spec.echo = false;
  LaunchResult r;
  ASSERT_TRUE(launch_and_wait(spec, &r).ok());
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_FALSE(r.succeeded());
  EXPECT_EQ(r.describe(), "killed by SIGKILL");
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
}

TEST(LauncherTest, MissingProgramIsAClearError) {
  LaunchSpec spec;
  spec.argv = {"/nonexistent/train"};
  spec.env = current_environment();
  LaunchResult r;
  Status s = launch_and_wait(spec, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/train"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no such program"), std::string::npos) << s.message();

  spec.argv = {"detaudit-no-such-program-xyz"};
  s = launch_and_wait(spec, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("in PATH"), std::string::npos) << s.message();
}

TEST(LauncherTest, MissingWorkingDirectoryIsAClearError) {
  LaunchSpec spec;
  spec.argv = {"/bin/true"};
  spec.env = current_environment();
  spec.cwd = "/nonexistent/dir";
  LaunchResult r;
  Status s = launch_and_wait(spec, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/dir"), std::string::npos) << s.message();
}

TEST(LauncherTest, EnvironmentAndWorkingDirectoryReachTheChild) {
  std::string dir = launcher_dir("env");
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo \"$DETAUDIT_T_VAR\"; pwd"};
  spec.env = {"DETAUDIT_T_VAR=hello", "PATH=/usr/bin:/bin"};
  spec.cwd = dir;
  spec.log_path = dir + "/output.log";
  spec.echo = false;
  LaunchResult r;
  ASSERT_TRUE(launch_and_wait(spec, &r).ok());
  EXPECT_EQ(read_file(spec.log_path), "hello\n" + fs::canonical(dir).string() + "\n");
}

TEST(LauncherTest, LargeOutputIsNotLost) {
  std::string dir = launcher_dir("large");
  LaunchSpec spec;
  // 200,000 lines on stdout and stderr at once: the pump must drain both pipes.
  spec.argv = {"/bin/sh", "-c", "seq 1 100000; seq 1 100000 >&2"};
  spec.env = current_environment();
  spec.log_path = dir + "/output.log";
  spec.echo = false;
  LaunchResult r;
  ASSERT_TRUE(launch_and_wait(spec, &r).ok());
  EXPECT_EQ(r.exit_code, 0);
  std::string log = read_file(spec.log_path);
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 200000);
}

TEST(LauncherTest, CaptureOutput) {
  std::string out;
  int code = -1;
  ASSERT_TRUE(capture_output({"/bin/sh", "-c", "echo 1.13.0; echo /x >&2; exit 0"},
                             current_environment(), "", &out, &code)
                  .ok());
  EXPECT_EQ(out, "1.13.0\n");
  EXPECT_EQ(code, 0);
}

TEST(SessionTest, FlagsOverrideConfigAndNameTheFlag) {
  Config c;
  c.runs = 1;
  RunFlags f;
  f.runs = 3;
  f.steps = "0-2,5";
  f.phases = "forward,backward";
  f.ops = "aten::*mm*";
  f.digest = "xxh3";
  f.no_stats = true;
  f.seed = 9;
  f.deterministic = "warn";
  f.threads = 2;
  f.env = {"A=1", "B=x=y"};
  f.command = {"/bin/true"};
  ASSERT_TRUE(apply_run_flags(f, &c).ok());
  EXPECT_EQ(c.runs, 3);
  EXPECT_TRUE(c.select.steps.contains(5));
  EXPECT_FALSE(c.select.steps.contains(3));
  EXPECT_FALSE(c.select.wants_phase(trace::Phase::kOptimizer));
  EXPECT_TRUE(c.select.wants_op("aten::addmm"));
  EXPECT_EQ(c.digest, trace::DigestAlgo::kXxh3);
  EXPECT_FALSE(c.stats);
  EXPECT_TRUE(c.inputs);
  EXPECT_EQ(*c.determinism.seed, 9u);
  EXPECT_EQ(c.determinism.algorithms, "warn");
  EXPECT_EQ(*c.determinism.intra_op_threads, 2);
  EXPECT_EQ(c.target.env.at("B"), "x=y");
  EXPECT_EQ(c.target.command, std::vector<std::string>{"/bin/true"});

  RunFlags bad;
  bad.steps = "0,x";
  Status s = apply_run_flags(bad, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("--steps: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("select.steps[1]"), std::string::npos) << s.message();
  RunFlags bad_env;
  bad_env.env = {"NOVALUE"};
  EXPECT_FALSE(apply_run_flags(bad_env, &c).ok());
  RunFlags bad_det;
  bad_det.deterministic = "maybe";
  s = apply_run_flags(bad_det, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--deterministic"), std::string::npos);
}

TEST(SessionTest, RunNeedsACommand) {
  Config c;
  EXPECT_FALSE(validate_for_run(c).ok());
  c.target.command = {"python3"};
  EXPECT_TRUE(validate_for_run(c).ok());
}

TEST(SessionTest, RefusesToOverwriteARunUnlessForced) {
  std::string dir = launcher_dir("overwrite") + "/run-0";
  ASSERT_TRUE(prepare_run_dir(dir, false).ok());
  EXPECT_TRUE(fs::is_directory(fs::path(dir) / layout::kStreamsDir));
  std::ofstream(dir + "/streams/old.dtr") << "x";
  Status s = prepare_run_dir(dir, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--force"), std::string::npos);
  ASSERT_TRUE(prepare_run_dir(dir, true).ok());
  EXPECT_FALSE(fs::exists(dir + "/streams/old.dtr"));  // a forced run never mixes with the old one
}

// A second `detaudit run` into the same --out is refused while the first holds it, and an --out
// that cannot be created is refused: both before any program starts.
TEST(SessionTest, OutIsHeldByOneRunAtATime) {
  const std::string out = launcher_dir("locked-out");
  {
    OutLock first;
    ASSERT_TRUE(first.acquire(out, "detaudit run").ok());
    OutLock second;
    Status s = second.acquire(out, "detaudit run");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), ExitCode::kUsage);
    EXPECT_NE(s.message().find("in use by another detaudit (detaudit run pid "), std::string::npos)
        << s.message();
  }
  OutLock again;  // released with its holder
  EXPECT_TRUE(again.acquire(out, "detaudit run").ok());
  OutLock nowhere;
  Status s = nowhere.acquire("/proc/detaudit-cannot-be-here", "detaudit run");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_NE(s.message().find("choose a directory you can write"), std::string::npos) << s.message();
}

TEST(SessionTest, TargetEnvironmentPrependsPreload) {
  setenv("LD_PRELOAD", "/other.so", 1);
  Config c;
  c.target.env["X"] = "1";
  auto env = target_environment(c, "/h/libdetaudit_hooks.so", "/runs/run-0");
  unsetenv("LD_PRELOAD");
  auto has = [&](const std::string& kv) {
    return std::find(env.begin(), env.end(), kv) != env.end();
  };
  EXPECT_TRUE(has("LD_PRELOAD=/h/libdetaudit_hooks.so:/other.so"));  // no shim above /h
  for (const std::string& kv : env) EXPECT_NE(kv.rfind(layout::kEnvInterposer, 0), 0u) << kv;
  EXPECT_TRUE(has("DETAUDIT_RUN_DIR=/runs/run-0"));
  EXPECT_TRUE(has("DETAUDIT_CONFIG=/runs/run-0/config.json"));
  EXPECT_TRUE(has("X=1"));
}

// Each run compiles from a cache of its own: a fresh one, or a copy of the one the user chose, as
// it was, so that no run loads what another compiled. The user's cache is left as it was.
TEST(SessionTest, EachRunStartsFromItsOwnCopyOfTheCompileCache) {
  const std::string root = launcher_dir("compile-cache");
  const std::string mine = root + "/mine";
  fs::create_directories(mine + "/fxgraph/ab");
  std::ofstream(mine + "/fxgraph/ab/entry") << "compiled";
  auto value = [](const std::vector<std::string>& env, const std::string& var) {
    for (const std::string& kv : env)
      if (kv.rfind(var + "=", 0) == 0) return kv.substr(var.size() + 1);
    return std::string("(unset)");
  };
  for (const std::string run : {"run-0", "run-1"}) {
    std::vector<std::string> env = {"X=1", "TORCHINDUCTOR_CACHE_DIR=" + mine};
    const std::string caches = root + "/" + run + "/compile-cache";
    EXPECT_TRUE(give_run_its_compile_caches(&env, caches).empty());
    EXPECT_EQ(value(env, "TORCHINDUCTOR_CACHE_DIR"), caches + "/torchinductor");
    EXPECT_EQ(value(env, "TRITON_CACHE_DIR"), caches + "/triton");  // unset: a fresh one
    std::ifstream copied(caches + "/torchinductor/fxgraph/ab/entry");
    std::string text;
    copied >> text;
    EXPECT_EQ(text, "compiled");
    // What this run compiles goes into its copy only.
    std::ofstream(caches + "/torchinductor/fxgraph/ab/new-" + run) << run;
  }
  EXPECT_FALSE(fs::exists(mine + "/fxgraph/ab/new-run-0"));
  EXPECT_FALSE(fs::exists(root + "/run-1/compile-cache/torchinductor/fxgraph/ab/new-run-0"));
  // A chosen cache that does not exist yet: the run starts empty, and nothing is created there.
  std::vector<std::string> env = {"TORCHINDUCTOR_CACHE_DIR=" + root + "/not-yet"};
  EXPECT_TRUE(give_run_its_compile_caches(&env, root + "/run-2/compile-cache").empty());
  EXPECT_EQ(value(env, "TORCHINDUCTOR_CACHE_DIR"), root + "/run-2/compile-cache/torchinductor");
  EXPECT_FALSE(fs::exists(root + "/not-yet"));
}

// An installed layout: <lib>/detaudit/libdetaudit_preload.so above torch/<version>/: LD_PRELOAD
// names the shim, DETAUDIT_INTERPOSER the hooks library it loads.
TEST(SessionTest, TargetEnvironmentPreloadsTheShimAboveTheInterposer) {
  const std::string lib = launcher_dir("shim") + "/lib/detaudit";
  fs::create_directories(lib + "/torch/2.13.0+cpu");
  const std::string hooks = lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so";
  std::ofstream(lib + "/" + layout::kPreloadLibrary) << "";
  Config c;
  auto env = target_environment(c, hooks, "/runs/run-0");
  auto has = [&](const std::string& kv) {
    return std::find(env.begin(), env.end(), kv) != env.end();
  };
  EXPECT_TRUE(has(std::string("LD_PRELOAD=") + lib + "/" + layout::kPreloadLibrary));
  EXPECT_TRUE(has(std::string(layout::kEnvInterposer) + "=" + hooks));
  // The probes' environment (no library) names neither.
  env = target_environment(c, "", "/runs/run-0");
  for (const std::string& kv : env) EXPECT_NE(kv.rfind(layout::kEnvInterposer, 0), 0u) << kv;
}

TEST(SessionTest, ExecuteRunWritesRunJson) {
  std::string out = launcher_dir("execute");
  Config c;
  c.out = out;
  c.target.command = {"/bin/sh", "-c",
                      "mkdir -p \"$DETAUDIT_RUN_DIR/streams\"; "
                      "echo 'attached' > \"$DETAUDIT_RUN_DIR/streams/r0.main.status\"; "
                      "touch \"$DETAUDIT_RUN_DIR/streams/r0.main.t0.dtr\"; "
                      "test -f \"$DETAUDIT_CONFIG\" && exit 5"};
  RunOptions o;
  o.hooks_library = "/nonexistent/libdetaudit_hooks.so";  // ld.so warns and goes on
  o.version = "test";
  o.echo = false;
  RunOutcome outcome;
  Status s = execute_run(c, o, 1, &outcome);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(outcome.result.exit_code, 5) << "config.json exists before the launch";
  EXPECT_EQ(outcome.streams, std::vector<std::string>{"r0.main.t0.dtr"});
  ASSERT_EQ(outcome.statuses.size(), 1u);
  EXPECT_EQ(outcome.statuses[0].second, "attached");
  auto j = nlohmann::json::parse(read_file(outcome.dir + "/run.json"));
  EXPECT_EQ(j["exit_code"], 5);
  EXPECT_TRUE(j["signal"].is_null());
  EXPECT_EQ(j["succeeded"], false);
  EXPECT_EQ(j["run"], 1);
  EXPECT_EQ(j["streams"][0], "r0.main.t0.dtr");
  EXPECT_EQ(j["hooks_library"], "/nonexistent/libdetaudit_hooks.so");
  EXPECT_TRUE(j.contains("duration_s"));
  EXPECT_TRUE(j.contains("hostname"));
  EXPECT_EQ(fs::path(outcome.dir).filename(), "run-1");
  Config back;
  ASSERT_TRUE(load_config(outcome.dir + "/config.json", &back).ok());
  EXPECT_EQ(back.target.command, c.target.command);
}

}  // namespace
}  // namespace detaudit::run
