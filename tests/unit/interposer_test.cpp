// `detaudit run` preloads the interposer built for the program's own torch: matched by the
// libtorch file, else by version and ABI; none fitting is a one-line usage error with the build
// command. Fake interpreters stand in for Python: the probe is a subprocess either way.
#include "run/interposer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_files.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;

std::string interposer_dir(const std::string& name) {
  return detaudit::testing::fresh_temp_dir("interposer_" + name);
}

void add_build(const std::string& lib_dir, const std::string& version, const std::string& libtorch,
               bool with_library = true) {
  fs::path dir = fs::path(lib_dir) / "torch" / version;
  fs::create_directories(dir);
  std::ofstream(dir / "torch.txt")
      << "version=" << version << "\ncxx11_abi=1\nlibtorch_cpu=" << libtorch
      << "\ncuda=\npython=\n";
  if (with_library) std::ofstream(dir / "libdetaudit_hooks.so") << "";
}

// An executable that prints what the real probe would: version, ABI, libtorch_cpu.
std::string fake_python(const std::string& dir, const std::string& version,
                        const std::string& libtorch) {
  std::string path = dir + "/python3";
  std::ofstream(path) << "#!/bin/sh\necho " << version << "\necho 1\necho " << libtorch << "\n";
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

TEST(InterposerTest, ListsCompleteBuildsOnly) {
  std::string lib = interposer_dir("list");
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  add_build(lib, "9.9.9", "/x/libtorch_cpu.so", /*with_library=*/false);
  auto builds = list_interposers(lib);
  ASSERT_EQ(builds.size(), 2u);
  EXPECT_EQ(builds[0].version, "1.13.1");
  EXPECT_EQ(builds[1].version, "2.13.0+cpu");
  EXPECT_EQ(builds[1].library, lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so");
  EXPECT_TRUE(list_interposers(lib + "/missing").empty());
}

TEST(InterposerTest, MatchesByLibraryThenVersion) {
  std::vector<InterposerBuild> builds(2);
  builds[0].version = "1.13.1";
  builds[0].libtorch_cpu = "/usr/lib/libtorch_cpu.so.1.13";
  builds[1].version = "2.13.0+cpu";
  builds[1].libtorch_cpu = "/venv-a/torch/lib/libtorch_cpu.so";
  ProgramTorch t;
  t.libtorch_cpu = "/usr/lib/libtorch_cpu.so.1.13";  // a C++ program: its library only
  EXPECT_EQ(match_interposer(builds, t), &builds[0]);
  t = {};
  t.version = "2.13.0+cpu";  // the same wheel in another venv
  t.cxx11_abi = 1;
  t.libtorch_cpu = "/venv-b/torch/lib/libtorch_cpu.so";
  EXPECT_EQ(match_interposer(builds, t), &builds[1]);
  t.cxx11_abi = 0;  // same version, other ABI: not the same build
  EXPECT_EQ(match_interposer(builds, t), nullptr);
  t = {};
  t.version = "2.13.0+cu128";  // a CUDA build of the same release is another libtorch
  EXPECT_EQ(match_interposer(builds, t), nullptr);
}

TEST(InterposerTest, ChoosesThePythonsTorch) {
  std::string dir = interposer_dir("choose");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  Config c;
  c.target.command = {fake_python(dir, "2.13.0+cpu", "/elsewhere/libtorch_cpu.so"), "train.py"};
  std::string chosen;
  Status s = choose_interposer(c, "", lib, "/src", &chosen);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(chosen, lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so");
}

TEST(InterposerTest, AScriptIsProbedThroughItsInterpreter) {
  std::string dir = interposer_dir("shebang");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  std::string python = fake_python(dir, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  std::string script = dir + "/torchrun";  // an entry point like torchrun
  std::ofstream(script) << "#!" << python << "\nimport sys\n";
  fs::permissions(script, fs::perms::owner_all);
  Config c;
  c.target.command = {script, "--nproc-per-node", "2", "train.py"};
  std::string chosen;
  ASSERT_TRUE(choose_interposer(c, "", lib, "/src", &chosen).ok());
  EXPECT_EQ(chosen, lib + "/torch/1.13.1/libdetaudit_hooks.so");
}

// `bash -c "cd run && /venv/bin/torchrun ..."`: the Python the script runs, not the PATH's.
TEST(InterposerTest, AShellCommandIsProbedThroughThePythonItRuns) {
  std::string dir = interposer_dir("shell");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  std::string python = fake_python(dir, "2.13.0+cpu", "/elsewhere/libtorch_cpu.so");
  std::string script = dir + "/torchrun";
  std::ofstream(script) << "#!/usr/bin/env " << python << "\nimport sys\n";
  fs::permissions(script, fs::perms::owner_all);
  for (const std::string& line :
       {"mkdir -p \"$DETAUDIT_RUN_DIR/w\" && cd \"$DETAUDIT_RUN_DIR/w\" && exec " + script +
            " --nproc-per-node 2 train.py",
        "OMP_NUM_THREADS=1 " + python + " -u train.py"}) {
    Config c;
    c.target.command = {"bash", "-c", line};
    std::string chosen;
    ASSERT_TRUE(choose_interposer(c, "", lib, "/src", &chosen).ok()) << line;
    EXPECT_EQ(chosen, lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so") << line;
  }
}

// `env OMP_NUM_THREADS=1 python ...`, `timeout 600 python ...`: the Python the launcher runs.
// Before, the launcher hid it and the first build was preloaded: a program that loaded another
// torch crashed (SIGBUS) with two libtorch in one process.
TEST(InterposerTest, ALauncherIsSeenThrough) {
  std::string dir = interposer_dir("launcher");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  std::string python = fake_python(dir, "2.13.0+cpu", "/elsewhere/libtorch_cpu.so");
  const std::vector<std::vector<std::string>> commands = {
      {"env", "OMP_NUM_THREADS=1", python, "train.py"},
      {"env", "-u", "CUDA_VISIBLE_DEVICES", "PATH=" + dir + ":/usr/bin:/bin", "python3", "x.py"},
      {"timeout", "600", python, "train.py"},
      {"taskset", "-c", "0-3", python, "-u", "train.py"},
      {"nice", "-n", "5", "env", "A=1", python}};
  for (const auto& command : commands) {
    Config c;
    c.target.command = command;
    c.target.env["PATH"] = "/usr/bin:/bin";  // no Python with torch but the launched one
    std::string chosen;
    Status s = choose_interposer(c, "", lib, "/src", &chosen);
    ASSERT_TRUE(s.ok()) << command[0] << ": " << s.message();
    EXPECT_EQ(chosen, lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so") << command[0];
  }
}

// Nothing tells the torch: one build is a fair guess, of several none is.
TEST(InterposerTest, AnUnknownTorchIsGuessedOnlyWhenOneIsBuilt) {
  std::string dir = interposer_dir("unknown");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so");
  Config c;
  c.target.command = {"/bin/true"};
  c.target.env["PATH"] = dir;  // no python3 to ask
  std::string chosen;
  ASSERT_TRUE(choose_interposer(c, "", lib, "/src", &chosen).ok());
  EXPECT_EQ(chosen, lib + "/torch/2.13.0+cpu/libdetaudit_hooks.so");

  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  chosen.clear();
  Status s = choose_interposer(c, "", lib, "/src", &chosen);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_TRUE(chosen.empty());
  const std::string& m = s.message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line";
  EXPECT_NE(m.find("`/bin/true`"), std::string::npos) << m;
  EXPECT_NE(m.find("1.13.1, 2.13.0+cpu"), std::string::npos) << m;
  EXPECT_NE(m.find("DETAUDIT_HOOKS="), std::string::npos) << m;
  // An explicit library is the user's choice.
  ASSERT_TRUE(choose_interposer(c, "/x/libdetaudit_hooks.so", lib, "/src", &chosen).ok());
}

TEST(InterposerTest, NoMatchNamesTheTorchAndTheBuildCommand) {
  std::string dir = interposer_dir("nomatch");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  Config c;
  std::string python = fake_python(dir, "2.14.1+cu128", "/venv/torch/lib/libtorch_cpu.so");
  c.target.command = {python, "train.py"};
  std::string chosen;
  Status s = choose_interposer(c, "", lib, "/src", &chosen);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  const std::string& m = s.message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line";
  EXPECT_NE(m.find("2.14.1+cu128"), std::string::npos) << m;
  EXPECT_NE(m.find("only for torch 1.13.1"), std::string::npos) << m;
  EXPECT_NE(m.find("cmake -S /src/hooks"), std::string::npos) << m;
  EXPECT_NE(m.find("-DDETAUDIT_TORCH=" + python), std::string::npos) << m;
  EXPECT_NE(m.find("-DDETAUDIT_INTERPOSER_DIR=" + lib), std::string::npos) << m;
}

TEST(InterposerTest, NothingBuiltSaysHowToBuild) {
  std::string dir = interposer_dir("none");
  Config c;
  c.target.command = {"/bin/true"};
  std::string chosen;
  Status s = choose_interposer(c, "", dir + "/lib/detaudit", "/src", &chosen);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_NE(s.message().find("-DDETAUDIT_TORCH="), std::string::npos) << s.message();
}

TEST(InterposerTest, AnExplicitLibraryMustFitWhenItSaysWhatItIs) {
  std::string dir = interposer_dir("explicit");
  std::string lib = dir + "/lib/detaudit";
  add_build(lib, "1.13.1", "/usr/lib/libtorch_cpu.so.1.13");
  std::string library = lib + "/torch/1.13.1/libdetaudit_hooks.so";
  Config c;
  c.target.command = {fake_python(dir, "2.13.0+cpu", "/venv/torch/lib/libtorch_cpu.so"), "t.py"};
  std::string chosen;
  EXPECT_FALSE(choose_interposer(c, library, lib, "/src", &chosen).ok());
  std::string bare = dir + "/libmine.so";  // hand-placed: no torch.txt, no check
  std::ofstream(bare) << "";
  ASSERT_TRUE(choose_interposer(c, bare, lib, "/src", &chosen).ok());
  EXPECT_EQ(chosen, bare);
}

TEST(InterposerTest, BuildCommandForACppProgramNamesItsLibtorch) {
  ProgramTorch t;
  t.libtorch_cpu = "/opt/libtorch/lib/libtorch_cpu.so";
  EXPECT_NE(build_command_for(t, "/src", "/b/lib/detaudit").find("-DDETAUDIT_TORCH=/opt/libtorch "),
            std::string::npos);
  t.libtorch_cpu = "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13";
  EXPECT_NE(build_command_for(t, "/src", "/b/lib/detaudit").find("-DDETAUDIT_TORCH=system "),
            std::string::npos);
}

TEST(InterposerTest, APipInstalledDetauditAdvisesPipIntoTheProgramsEnvironment) {
  std::string package = interposer_dir("pip") + "/site-packages/detaudit";
  std::filesystem::create_directories(package + "/lib/detaudit");
  ProgramTorch t;
  t.python = "/other/venv/bin/python";
  t.libtorch_cpu = "/other/venv/torch/lib/libtorch_cpu.so";
  const std::string lib = package + "/lib/detaudit";
  EXPECT_NE(build_command_for(t, "/src", lib).find("-DDETAUDIT_TORCH="), std::string::npos)
      << "a build tree, not a package: CMake";
  std::ofstream(package + "/__init__.py") << "";
  EXPECT_EQ(build_command_for(t, "/src", lib),
            "/other/venv/bin/python -m pip install --no-build-isolation /src (detaudit in that "
            "environment, built for its torch)");
}

// A CUDA run gets the device digest by default: an interposer with the kernels, and a GPU the
// program can see. Anything less keeps MD5 (host copies).
TEST(InterposerTest, TheDeviceDigestIsTheDefaultOnlyWithKernelsAndAVisibleGpu) {
  const std::string lib = interposer_dir("device_default");
  add_build(lib, "2.14.1+cu130", "/venv/torch/lib/libtorch_cpu.so");
  const fs::path dir = fs::path(lib) / "torch" / "2.14.1+cu130";
  std::ofstream(dir / "torch.txt", std::ios::app) << "device_digest=ON\n";
  InterposerBuild build;
  ASSERT_TRUE(read_interposer_build(dir.string(), &build).ok());
  EXPECT_TRUE(build.device_digest);

  const std::string dev = interposer_dir("device_default_dev");
  std::ofstream(dev + "/nvidiactl") << "";  // the driver alone: no GPU
  Config config;
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kMd5);
  std::ofstream(dev + "/nvidia0") << "";
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kDevice);
  config.target.env["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kMd5);
  config.target.env["CUDA_VISIBLE_DEVICES"] = "-1";
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kMd5);
  config.target.env["CUDA_VISIBLE_DEVICES"] = "0";
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kDevice);
  build.device_digest = false;  // a CPU torch, or built without nvcc
  EXPECT_EQ(default_digest(config, build, dev), trace::DigestAlgo::kMd5);
}

}  // namespace
}  // namespace detaudit::run
