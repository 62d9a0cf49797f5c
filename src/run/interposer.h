// Which interposer `detaudit run` preloads. hooks/ is built once per torch, each build into
// <lib>/torch/<version>/ beside a torch.txt that says what it was built against; the program's own
// torch picks one, so a Python from any virtual environment, or a C++ program, gets the interposer
// built for the libtorch it loads.
//
//   std::vector<InterposerBuild> builds = list_interposers(prefix + "/lib/detaudit");
//   ProgramTorch torch = probe_program_torch(config);
//   const InterposerBuild* b = match_interposer(builds, torch);  // nullptr: none fits
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "util/status.h"

namespace detaudit::run {

struct InterposerBuild {
  std::string library;         // .../torch/<version>/libdetaudit_hooks.so
  std::string version;         // torch.__version__ ("2.13.0+cpu") or libtorch's ("1.13.1")
  bool cxx11_abi = true;       // _GLIBCXX_USE_CXX11_ABI of that torch
  std::string libtorch_cpu;    // the real path of the libtorch_cpu it linked
  std::string python;          // the Python it was built for; empty for "system" or a prefix
  bool device_digest = false;  // built with the device digest's CUDA kernels
};

// Reads <dir>/torch.txt ("key=value" lines) and checks that the library beside it exists.
Status read_interposer_build(const std::string& dir, InterposerBuild* build);
// Every complete build under <lib_dir>/torch/, sorted by version.
std::vector<InterposerBuild> list_interposers(const std::string& lib_dir);

// The torch the audited program will load, as far as a probe can tell without recording it.
struct ProgramTorch {
  std::string version;       // empty: unknown (a C++ program tells only its library)
  int cxx11_abi = -1;        // -1: unknown
  std::string libtorch_cpu;  // real path; empty: unknown
  std::string python;        // the Python that was asked, if any
  std::string described;     // for messages: "/venv/bin/python imports torch 2.13.0+cpu (...)"
  bool known() const { return !version.empty() || !libtorch_cpu.empty(); }
};

// Asks the program's Python (argv[0], a script's #! interpreter, else python3 on the program's
// PATH) for its torch, or ldd for the libtorch a C++ program links. Never records anything.
ProgramTorch probe_program_torch(const Config& config);

// The build made for this torch: the same libtorch file, else the same version and ABI.
const InterposerBuild* match_interposer(const std::vector<InterposerBuild>& builds,
                                        const ProgramTorch& torch);

// The one-line command that builds an interposer for `torch` (what DETAUDIT_TORCH to pass).
std::string build_command_for(const ProgramTorch& torch, const std::string& source_dir,
                              const std::string& lib_dir);

// The digest a run gets when neither the config nor --digest names one: the device digest where
// the interposer has its kernels and the program can see a GPU (a /dev/nvidia<N> device, and
// CUDA_VISIBLE_DEVICES, from the target's env or ours, not hiding them all); otherwise MD5.
// `dev_dir` is /dev, a test's folder in tests.
trace::DigestAlgo default_digest(const Config& config, const InterposerBuild& build,
                                 const std::string& dev_dir = "/dev");

// Picks the interposer for the program: an explicit one ($DETAUDIT_HOOKS) must fit its torch when
// a torch.txt stands beside it; otherwise the matching build. Fails with kUsage, in one line
// naming the torch found and the command that builds an interposer for it.
Status choose_interposer(const Config& config, const std::string& explicit_library,
                         const std::string& lib_dir, const std::string& source_dir,
                         std::string* library);

}  // namespace detaudit::run
