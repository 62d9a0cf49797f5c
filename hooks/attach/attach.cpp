// Attaches the recorder to a process: runs at load time under LD_PRELOAD, registers the
// RecordFunction callback, and makes sure recorded bytes reach disk at exit, at _exit (forked
// DataLoader workers leave through os._exit), and on a crash.
#include <ATen/record_function.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "attach/op_callback.h"
#include "process/environment.h"
#include "recorder/recorder.h"
#include "run_layout.h"

namespace detaudit::hooks {
namespace {

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (ThreadRecorder* t = ThreadRecorder::current()) t->on_start(fn);
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (ThreadRecorder* t = ThreadRecorder::current()) t->on_end(fn);
}

// The process whose records are ours to flush: set at attach and in a forked child (atfork). A
// vfork child shares our memory and runs no atfork handler: when its exec fails, it leaves
// through _exit (CPython's subprocess, for a program that is not there), and must not finish
// the parent's streams from there.
std::atomic<pid_t> g_recording_pid{0};

// The thread whose fatal signal is being saved, 0 while none: a second crash, or the process
// leaving through exit, must not end the process under that save.
std::atomic<pid_t> g_signal_thread{0};
std::atomic<bool> g_signal_saved{false};
// The handler's own bound (run_from_signal's) with a margin: past it the save is given up.
constexpr int64_t kSignalSaveBoundMs = 12000;

pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// On a thread that would end the process (a second crash, exit, _exit) while another thread's
// signal is being saved: waits for that save, and a while after it for its handler to end the
// process with its signal (the program's own exit status), within the handler's bound.
void wait_out_another_threads_signal() {
  const pid_t saving = g_signal_thread.load();
  if (saving == 0 || saving == this_thread_id()) return;
  const int64_t deadline = monotonic_ms() + kSignalSaveBoundMs;
  while (!g_signal_saved.load() && monotonic_ms() < deadline) sleep_ms(1);
  const int64_t grace = monotonic_ms() + 2000;
  while (monotonic_ms() < grace) sleep_ms(1);
}

void flush_everything() {
  static std::atomic<bool> done{false};
  if (::getpid() != g_recording_pid.load()) return;
  wait_out_another_threads_signal();
  ProcessRecorder::instance().mark_exit_started();
  if (!ProcessRecorder::instance().active() || done.exchange(true)) return;
  ProcessRecorder::instance().finish_all();
}

struct sigaction g_previous[32];
const int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM, SIGINT};

// What a signal's handler saves, on the writer thread (StreamWriter::run_from_signal).
struct SignalSave {
  int sig;
  ThreadRecorder* stopped;  // the thread the handler runs on, if it records
};

void save_for_signal(void* arg) {
  const SignalSave& save = *static_cast<SignalSave*>(arg);
  // Every thread's records so far, whether the program was told to stop (a CI runner, a
  // scheduler, Ctrl-C) or crashed (its own abort, a fault): a crash in one thread at exit (gloo's
  // at interpreter teardown) must not lose what the others recorded.
  if (ProcessRecorder::instance().active())
    ProcessRecorder::instance().save_on_signal(save.sig, save.stopped);
}

// Dies of the signal as the process would have without us.
void die_of(int sig) {
  sigaction(sig, &g_previous[sig], nullptr);
  raise(sig);
}

// How long a stop signal waits for its thread's next whole record (defer_stop_signal): inside
// its buffer, the rest of the record (or a thread's last MD5 batch, at its end); outside, the
// next op, which a training loop reaches within milliseconds.
constexpr long kStopDeferInsideMs = 3000;
constexpr long kStopDeferOutsideMs = 500;

void on_fatal_signal(int sig) {
  const pid_t self = this_thread_id();
  if ((sig == SIGTERM || sig == SIGINT) && g_signal_thread.load() == 0)
    if (ThreadRecorder* t = ThreadRecorder::current_if_any(); t && t->stream_open()) {
      if (StreamWriter::instance().defer_stop_signal(t->stream(), sig, self,
                                                     {kStopDeferOutsideMs, kStopDeferInsideMs}))
        return;
    }
  pid_t first = 0;
  if (!g_signal_thread.compare_exchange_strong(first, self)) {
    // A fault inside this thread's own save dies at once. Another thread's crash waits for the
    // first signal's save, which then ends the process with that signal; were the default action
    // taken now, it would cut every stream mid-save.
    wait_out_another_threads_signal();
    die_of(sig);
    return;
  }
  SignalSave save{sig, ThreadRecorder::current_if_any()};
  StreamWriter::instance().run_from_signal(save_for_signal, &save, /*max_wait_ms=*/10000);
  g_signal_saved.store(true);
  die_of(sig);
}

void install_signal_handlers() {
  for (int sig : kFatalSignals) {
    struct sigaction current;
    sigaction(sig, nullptr, &current);
    // Leave handlers the program installed alone; chain only to the default action.
    if (current.sa_handler != SIG_DFL) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    // Not SA_RESETHAND: a second thread's crash would take the default action at once, under
    // the first one's save. SA_NODEFER lets a fault in the handler reach it again, and die.
    // SA_RESTART: a stop signal put off returns from the handler, and a read or wait of the
    // program's that it interrupted goes on, rather than failing with EINTR.
    sa.sa_flags = SA_NODEFER | SA_RESTART;
    sigaction(sig, &sa, &g_previous[sig]);
  }
}

void atfork_prepare() { ProcessRecorder::instance().before_fork(); }
void atfork_parent() { ProcessRecorder::instance().after_fork_parent(); }
void atfork_child() {
  g_recording_pid.store(::getpid());
  g_signal_thread.store(0);
  g_signal_saved.store(false);
  ProcessRecorder::instance().after_fork_child();
}

bool load_config(Config* config, std::string* error) {
  const char* path = std::getenv(layout::kEnvConfig);
  if (!path) return true;  // defaults
  Status s = detaudit::load_config(path, config);
  if (!s.ok()) *error = s.message();
  return s.ok();
}

__attribute__((constructor)) void attach() {
  const char* run_dir = std::getenv(layout::kEnvRunDir);
  if (!run_dir || !*run_dir) return;  // loaded, not asked to record
  Config config;
  std::string error;
  ProcessRecorder& proc = ProcessRecorder::instance();
  if (!load_config(&config, &error)) {
    std::fprintf(stderr, "detaudit: error: %s; recording is off for this process\n", error.c_str());
    return;
  }
  std::string applied = apply_determinism(config.determinism);
  if (!proc.init(run_dir, config, &error)) {
    if (!error.empty()) std::fprintf(stderr, "detaudit: error: %s\n", error.c_str());
    return;
  }
  // Two callbacks with one body, one of them on at a time (ProcessRecorder::set_callbacks): the
  // op callback (op_callback.h), and the marks callback in the user scope alone; for a sentinel
  // with its inputs (a `detaudit::backward` mark carries the loss; user scopes are few).
  proc.set_callbacks(op_callback(on_op_start, on_op_end),
                     at::RecordFunctionCallback(on_op_start, on_op_end)
                         .needsInputs(config.sentinel)
                         .scopes({at::RecordScope::USER_SCOPE}));
  g_recording_pid.store(::getpid());
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  std::atexit(flush_everything);
  // Loaded by the preload shim (src/preload/preload.c), whose _exit comes first: it flushes.
  using Register = void (*)(void (*)());
  if (auto shim = reinterpret_cast<Register>(dlsym(RTLD_DEFAULT, "detaudit_preload_flush_at_exit")))
    shim(flush_everything);
  install_signal_handlers();
  proc.note_status("attached libtorch " + torch_version() + " pid " + std::to_string(::getpid()) +
                   (applied.empty() ? "" : " applied" + applied));
}

}  // namespace
}  // namespace detaudit::hooks

// Forked DataLoader workers end with os._exit(), which skips atexit: flush there too. (Preloaded
// itself; loaded by the shim, the shim's _exit is the one called.)
extern "C" [[noreturn]] void _exit(int status) {
  detaudit::hooks::flush_everything();
  // Even once flushed: a signal that came during the flush is being saved.
  detaudit::hooks::wait_out_another_threads_signal();
  using ExitFn = void (*)(int);
  static ExitFn real = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit"));
  real(status);
  __builtin_unreachable();
}
