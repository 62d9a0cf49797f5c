// posix_spawn plus a poll() pump: the target keeps its terminal output while we keep a copy.
#include "run/launcher.h"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

extern char** environ;

namespace detaudit::run {
namespace {

// The child being supervised, for the signal handler. One at a time.
std::atomic<pid_t> g_child{0};
std::atomic<int> g_interrupt{0};

void forward_signal(int sig, siginfo_t* info, void*) {
  g_interrupt = sig;
  // A terminal's ^C already reaches the whole foreground process group, child included; pass on
  // only signals sent to us alone (kill, a job scheduler), so the child never gets two.
  if (info && info->si_code == SI_KERNEL) return;
  pid_t child = g_child.load();
  if (child > 0) kill(child, sig);
}

// Installs the forwarding handlers for its lifetime and puts the old ones back after.
class SignalForwarder {
 public:
  explicit SignalForwarder(pid_t child) {
    g_child = child;
    struct sigaction sa {};
    sa.sa_sigaction = forward_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;  // a closed stdout must not kill us before the log is complete
    sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalForwarder() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_child = 0;
  }

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_pipe_{};
};

void write_all(int fd, const char* p, size_t n) {
  while (n > 0 && fd >= 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // our stdout went away: keep pumping into the log regardless
    }
    p += w;
    n -= size_t(w);
  }
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string utc_now_iso() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}

// Spawns argv with stdout/stderr on the given pipe write ends (or untouched when -1).
Status spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::string& cwd, int out_fd, int err_fd, pid_t* pid) {
  if (argv.empty() || argv[0].empty()) return Status::error("no program to run");
  if (!cwd.empty()) {
    struct stat st {};
    if (stat(cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::error(
          fmt::format("cannot run {}: working directory {} does not exist", argv[0], cwd));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  // The child starts with default signal handling even though we catch SIGINT/SIGTERM.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);

  auto args = c_strings(argv);
  auto envp = c_strings(env);
  int rc = posix_spawnp(pid, argv[0].c_str(), &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    if (rc == ENOENT)
      return Status::error(fmt::format("cannot run {}: no such program{}", argv[0],
                                       argv[0].find('/') == std::string::npos ? " in PATH" : ""));
    return Status::error(fmt::format("cannot run {}: {}", argv[0], std::strerror(rc)));
  }
  return Status();
}

void decode_wait_status(int status, LaunchResult* result) {
  if (WIFEXITED(status)) {
    result->exit_code = WEXITSTATUS(status);
    result->signal = 0;
  } else if (WIFSIGNALED(status)) {
    result->exit_code = -1;
    result->signal = WTERMSIG(status);
  }
}

}  // namespace

int interrupted() { return g_interrupt.load(); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string LaunchResult::describe() const {
  if (signal != 0) return "killed by " + signal_name(signal);
  return fmt::format("exit code {}", exit_code);
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

Status launch_and_wait(const LaunchSpec& spec, LaunchResult* result) {
  *result = LaunchResult{};
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0)
      return Status::error(fmt::format("cannot create {}: {}", spec.log_path, std::strerror(errno)),
                           ExitCode::kBadInput);
  }
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    if (log_fd >= 0) ::close(log_fd);
    return Status::error(fmt::format("cannot create pipes: {}", std::strerror(errno)));
  }

  result->start_time = utc_now_iso();
  auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  Status s = spawn(spec.argv, spec.env, spec.cwd, out_pipe[1], err_pipe[1], &pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (!s.ok()) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    if (log_fd >= 0) ::close(log_fd);
    return s;
  }

  SignalForwarder forwarder(pid);
  struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  const int echo_fds[2] = {spec.echo ? STDOUT_FILENO : -1, spec.echo ? STDERR_FILENO : -1};
  int open_fds = 2;
  bool exited = false;
  int status = 0;
  std::chrono::steady_clock::time_point exited_at;
  char buf[65536];
  while (open_fds > 0) {
    int n = ::poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      write_all(echo_fds[i], buf, size_t(r));
      write_all(log_fd, buf, size_t(r));
    }
    if (spec.on_tick) spec.on_tick();
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      exited_at = std::chrono::steady_clock::now();
    }
    // A grandchild that outlives the target may hold the pipes open: drain briefly, then stop.
    if (exited && std::chrono::steady_clock::now() - exited_at > std::chrono::seconds(2)) break;
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  if (!exited) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  result->duration_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  decode_wait_status(status, result);
  if (log_fd >= 0) ::close(log_fd);
  return Status();
}

Status capture_output(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const std::string& cwd, std::string* out, int* exit_code) {
  out->clear();
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0)
    return Status::error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  pid_t pid = 0;
  Status s = spawn(argv, env, cwd, out_pipe[1], devnull, &pid);
  ::close(out_pipe[1]);
  if (devnull >= 0) ::close(devnull);
  if (!s.ok()) {
    ::close(out_pipe[0]);
    return s;
  }
  char buf[4096];
  for (;;) {
    ssize_t r = ::read(out_pipe[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    out->append(buf, size_t(r));
  }
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  LaunchResult r;
  decode_wait_status(status, &r);
  *exit_code = r.signal ? 128 + r.signal : r.exit_code;
  return Status();
}

}  // namespace detaudit::run
