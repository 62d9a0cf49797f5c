#include "process/stream_identity.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <vector>

#include "process/python_state.h"

namespace detaudit::hooks {
namespace {

std::string os_thread_name(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    out += keep ? c : '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "thread" : out.substr(0, 64);
}

ThreadIdentity thread_identity() {
  const long tid = long(syscall(SYS_gettid));
  if (tid == long(getpid())) return {"main"};
  if (auto name = python::thread_name()) {
    // Python names a thread "Thread-<n> (<target>)": torch.utils.data's is _pin_memory_loop.
    const bool pins = name->find("(_pin_memory_loop)") != std::string::npos;
    return {file_safe(*name), pins};
  }
  // New threads inherit their creator's name: only a name the thread was given tells a role.
  std::string own = os_thread_name(tid);
  if (!own.empty() && own != os_thread_name(long(getpid()))) return {file_safe(own)};
  return {"thread"};
}

std::string exec_child_role(const std::string& parent_role) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  std::string program = argv.empty() ? "child" : base_name(argv[0]);
  // An interpreter is named by what it runs: `python -m module`, or the script.
  if (program.rfind("python", 0) == 0) {
    for (size_t i = 1; i < argv.size(); ++i) {
      if (argv[i] == "-m" && i + 1 < argv.size()) {
        program = argv[i + 1];
        break;
      }
      if (argv[i] == "-c") {
        program = "python-c";
        break;
      }
      if (!argv[i].empty() && argv[i][0] != '-') {
        std::string script = base_name(argv[i]);
        if (script == "__main__.py" && argv[i].find('/') != std::string::npos) {
          std::string dir = argv[i].substr(0, argv[i].find_last_of('/'));
          script = base_name(dir);
        }
        program = script.size() > 3 && script.compare(script.size() - 3, 3, ".py") == 0
                      ? script.substr(0, script.size() - 3)
                      : script;
        break;
      }
    }
  }
  return parent_role + "." + file_safe(program);
}

int create_exclusive(const std::string& dir, const std::string& stem, const std::string& ext,
                     std::string* claimed) {
  for (int k = 0; k < 1000; ++k) {
    std::string name = k == 0 ? stem : stem + "~" + std::to_string(k);
    int fd = ::open((dir + "/" + name + ext).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                    0644);
    if (fd >= 0) {
      *claimed = name;
      return fd;
    }
    if (errno != EEXIST) break;
  }
  return -1;
}

}  // namespace detaudit::hooks
