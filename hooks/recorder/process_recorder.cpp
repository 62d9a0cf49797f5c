// ProcessRecorder: what one process shares (config, step, program order, its name) and how it
// changes: step ends, the op callback on and off, forks, and DataLoader workers' batches.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "process/environment.h"
#include "process/python_state.h"
#include "process/stream_identity.h"
#include "recorder/recorder.h"
#include "run_layout.h"
#include "tensors/device_digests.h"
#include "tensors/md5_tensor_batch.h"
#include "tensors/tensor_digest.h"
#include "trace/process_status.h"

namespace detaudit::hooks {

namespace {

// Appends lines to a .status file with write(): a signal's save may run while a stdio lock is held.
void append_lines(const std::string& status_path, const std::vector<std::string>& lines) {
  if (status_path.empty()) return;
  int fd = ::open(status_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;
  for (const std::string& line : lines) {
    if (line.empty()) continue;
    const std::string text = line + "\n";
    (void)!::write(fd, text.data(), text.size());
  }
  ::close(fd);
}

}  // namespace

ProcessRecorder& ProcessRecorder::instance() {
  static ProcessRecorder* p = new ProcessRecorder();  // outlives static destruction
  return *p;
}

bool ProcessRecorder::init(const std::string& run_dir, const Config& config, std::string* error) {
  config_ = config;
  if (const char* mode = std::getenv(layout::kEnvResume); mode && std::strcmp(mode, "resume") == 0)
    if (const char* at = std::getenv(layout::kEnvResumeAt))
      resumed_at_ = std::strtoull(at, nullptr, 10);
  set_device_batch_cap(uint64_t(config.device_batch_mib) << 20);
  streams_dir_ = run_dir + "/" + layout::kStreamsDir;
  ::mkdir(run_dir.c_str(), 0755);
  if (::mkdir(streams_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = "cannot create " + streams_dir_ + ": " + std::strerror(errno);
    return false;
  }
  const char* rank_var = nullptr;
  for (const char* var : {"RANK", "LOCAL_RANK"}) {
    if ((rank_var = std::getenv(var))) {
      rank_ = std::strtol(rank_var, nullptr, 10);
      rank_known_ = true;
      break;
    }
  }
  // `srun` starts one task a rank and says which in SLURM_PROCID. Not passed on as a rank
  // variable: under `srun torchrun` it numbers the node, and its workers have a RANK of their own.
  if (const char* task = std::getenv("SLURM_PROCID"); !rank_known_ && task && *task) {
    rank_ = std::strtol(task, nullptr, 10);
    rank_known_ = true;
  }
  // A child a recorded process started (fork and exec): named by what it runs, unless it is a
  // rank's own process under a launcher (torchrun's workers get RANK, the launcher has none).
  const std::string own_rank_var = rank_var ? rank_var : "";
  const char* parent = std::getenv(layout::kEnvParentProcess);
  const char* parent_rank_var = std::getenv(layout::kEnvParentRank);
  if (parent && parent_rank_var && own_rank_var == parent_rank_var) {
    std::string parent_name = parent;
    size_t dot = parent_name.find('.');
    role_ = exec_child_role(dot == std::string::npos ? "main" : parent_name.substr(dot + 1));
  }
  is_python_ = python::host_is_python();
  // Ranks whose collectives may come only after the first step (`srun python train.py`, each
  // task its own rank, sets SLURM_NTASKS and no WORLD_SIZE): never lean.
  for (const char* var : {"WORLD_SIZE", "SLURM_NTASKS"})
    if (const char* n = std::getenv(var)) several_ranks_ |= std::strtol(n, nullptr, 10) > 1;
  if (!config_.select.ranks.contains(uint64_t(rank_))) return false;
  // The name this process means to claim (claimed at its first record: process_name()).
  ::setenv(layout::kEnvParentProcess, layout::process_name(rank_, role_).c_str(), 1);
  ::setenv(layout::kEnvParentRank, own_rank_var.c_str(), 1);
  refresh_step_state(0);
  active_ = true;
  return true;
}

void ProcessRecorder::note_status(const std::string& text) {
  std::lock_guard<std::mutex> lock(claim_mu_);
  claim_note_ = text;
}

void ProcessRecorder::adopt_group_rank(int64_t rank) {
  std::lock_guard<std::mutex> lock(claim_mu_);
  if (rank_known_ || rank < 0) return;
  rank_known_ = true;
  if (process_name_.empty()) {
    rank_ = rank;
    return;
  }
  // Named before the group existed: the name keeps its rank, the .status says which it is.
  std::ofstream(status_path_, std::ios::app)
      << "process group rank " << rank << " (named r" << rank_
      << ": ops ran before init_process_group; set RANK to name it)\n";
}

const std::string& ProcessRecorder::process_name() {
  bool ask_python;
  {
    std::lock_guard<std::mutex> lock(claim_mu_);
    if (!process_name_.empty()) return process_name_;
    ask_python = !rank_known_ && is_python_;
  }
  // A torch.multiprocessing.spawn child knows its rank only as the spawn index. Asked outside
  // the lock: asking Python takes the GIL.
  const std::optional<int64_t> spawned = ask_python ? python::spawn_index() : std::nullopt;
  std::lock_guard<std::mutex> lock(claim_mu_);
  if (process_name_.empty()) {
    if (spawned && !rank_known_) {
      rank_ = *spawned;
      rank_known_ = true;
      // Like a launcher's worker: that rank's main process (the launcher has no rank).
      const char* parent_rank = std::getenv(layout::kEnvParentRank);
      if (parent_rank && *parent_rank == '\0') role_ = "main";
    }
    // Registered now, after the program's own start-up: it runs before the exit handlers and
    // static destructors the program set up before its first op, so a crash in those (a
    // library's thread aborting at teardown) is known to come while exiting.
    static std::once_flag exit_watch;
    std::call_once(exit_watch,
                   [] { std::atexit([] { ProcessRecorder::instance().mark_exit_started(); }); });
    int fd = create_exclusive(streams_dir_, layout::process_name(rank_, role_), layout::kStatusExt,
                              &process_name_);
    if (fd < 0) {
      process_name_ = layout::process_name(rank_, role_) + "~" + std::to_string(::getpid());
      status_path_.clear();
    } else {
      status_path_ = streams_dir_ + "/" + process_name_ + layout::kStatusExt;
      if (!claim_note_.empty()) {
        std::string line = claim_note_ + "\n";
        (void)!::write(fd, line.data(), line.size());
      }
      ::close(fd);
    }
  }
  return process_name_;
}

void ProcessRecorder::write_status(const std::string& text) {
  std::ofstream(streams_dir_ + "/" + process_name() + layout::kStatusExt) << text << "\n";
}

void ProcessRecorder::refresh_step_state(uint64_t step) {
  const bool selected = config_.select.steps.contains(resumed_at_ + step);
  step_selected_.store(selected, std::memory_order_relaxed);
  step_rng_.store(default_rng_digest(), std::memory_order_relaxed);
  // A worker needs its ops seen in every step: they tell which batch it is making.
  if (worker_ != Worker::kNo) return;
  std::lock_guard<std::mutex> lock(op_callback_mu_);
  switch_op_callback(selected && !(lean_step(step) && !optimizer_window_.load()));
}

void ProcessRecorder::switch_op_callback(bool on) {
  if (!op_callback_ || on == op_callback_on_.load()) return;
  if (on) op_callback_epoch_.fetch_add(1, std::memory_order_release);
  // The new one first: a mark entered in between is seen by one of them.
  const at::CallbackHandle previous = registered_callback_;
  registered_callback_ = at::addGlobalCallback(on ? *op_callback_ : *marks_callback_);
  at::removeCallback(previous);
  op_callback_on_.store(on);
}

bool ProcessRecorder::watched_step(uint64_t step) const {
  return config_.sentinel &&
         !(config_.full_steps && config_.full_steps->contains(resumed_at_ + step));
}

bool ProcessRecorder::may_be_a_replica() {
  if (several_ranks_ || collective_seen_.load()) return true;
  process_name();  // a spawned child learns its rank when it claims its name
  std::lock_guard<std::mutex> lock(claim_mu_);
  return rank_known_;
}

bool ProcessRecorder::lean_step(uint64_t step) const {
  return lean_.load(std::memory_order_relaxed) && step >= lean_from_.load() && watched_step(step);
}

void ProcessRecorder::learn_lean_sentinel() {
  if (!config_.sentinel || lean_.load() || worker_ != Worker::kNo || several_ranks_ ||
      collective_seen_.load() || optimizer_threads_.load() || !optimizer_marked_.load() ||
      !backward_marked_.load())
    return;
  lean_from_.store(step());
  lean_.store(true);
}

void ProcessRecorder::stop_lean_sentinel(const char* why) {
  if (!lean_.exchange(false)) return;
  {
    std::lock_guard<std::mutex> lock(lean_stop_mu_);
    lean_stop_ = "from step " + std::to_string(step()) + ": " + why;
  }
  refresh_step_state(step());
}

void ProcessRecorder::saw_optimizer_mark() {
  if (!config_.sentinel) return;
  optimizer_marked_.store(true, std::memory_order_relaxed);
  const pid_t self = pid_t(::syscall(SYS_gettid));
  pid_t first = 0;
  if (optimizer_thread_.compare_exchange_strong(first, self) || first == self) return;
  optimizer_threads_.store(true);
  stop_lean_sentinel("a second thread entered an optimizer mark");
}

void ProcessRecorder::saw_collective() {
  // Seen with the op callback on (a full or optimizer window's step).
  if (!collective_seen_.exchange(true)) stop_lean_sentinel("a collective ran");
}

void ProcessRecorder::open_optimizer_window() {
  if (!lean_step(step()) || !step_selected() || worker_ != Worker::kNo) return;
  std::lock_guard<std::mutex> lock(op_callback_mu_);
  optimizer_window_.store(true);
  switch_op_callback(true);
}

void ProcessRecorder::close_optimizer_window() {
  if (!optimizer_window_.load()) return;
  std::lock_guard<std::mutex> lock(op_callback_mu_);
  optimizer_window_.store(false);
  switch_op_callback(step_selected() && !lean_step(step()));
}

bool ProcessRecorder::loss_from_marks() const {
  return lean_step(step()) && step_selected() && !optimizer_window_.load() &&
         worker_ == Worker::kNo;
}

void ProcessRecorder::set_callbacks(at::RecordFunctionCallback ops,
                                    at::RecordFunctionCallback marks) {
  {
    std::lock_guard<std::mutex> lock(op_callback_mu_);
    op_callback_ = ops;
    marks_callback_ = marks;
    registered_callback_ = at::addGlobalCallback(ops);
    op_callback_on_.store(true);
  }
  refresh_step_state(step());
}

void ProcessRecorder::mark_step_end() {
  if (worker_ == Worker::kYes) return;  // a worker's step is its batch's
  // With the op callback off no op is being recorded, so none can straddle the boundary.
  if (op_callback_ && !op_callback_on_.load())
    advance_step();
  else
    step_pending_.store(true, std::memory_order_relaxed);
}

void ProcessRecorder::advance_step() { set_step(step_.load(std::memory_order_relaxed) + 1); }

void ProcessRecorder::set_step(uint64_t step) {
  // What a step's ops produced is digested in that step: the next may run with the op callback
  // off, and write those bytes unseen.
  launch_open_batches(Launch::kStep);
  step_.store(step, std::memory_order_relaxed);
  learn_lean_sentinel();
  refresh_step_state(step);
  if (worker_ != Worker::kYes) write_progress(step);
}

// "step N", rewritten in place at each step: the launcher reads how far a run is, and what a
// step costs, from it (src/run/recording_watch.h). Best effort: a failure costs nothing else.
void ProcessRecorder::write_progress(uint64_t step) {
  const pid_t self = ::getpid();
  if (progress_pid_ != self) {
    if (progress_fd_ >= 0) ::close(progress_fd_);  // a fork's copy of its parent's
    const std::string path = streams_dir_ + "/" + process_name() + layout::kProgressExt;
    progress_fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    progress_pid_ = self;
  }
  if (progress_fd_ < 0) return;
  char line[40];
  const int n = std::snprintf(line, sizeof line, "step %020llu\n", (unsigned long long)step);
  if (n > 0) (void)!::pwrite(progress_fd_, line, size_t(n), 0);
}

void ProcessRecorder::at_top_level_op() {
  // Only a worker's main thread runs its loop; other threads would not find it.
  if (worker_ != Worker::kNo && ::syscall(SYS_gettid) == ::getpid()) {
    follow_worker_batch();
    if (worker_ == Worker::kYes) return;
  }
  if (!step_pending_.load(std::memory_order_relaxed)) return;
  if (!step_pending_.exchange(false)) return;
  advance_step();
}

std::optional<uint64_t> ProcessRecorder::consumer_step() const {
  char line[40] = {};
  const int fd = ::open(parent_progress_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const ssize_t n = ::pread(fd, line, sizeof line - 1, 0);
  ::close(fd);
  unsigned long long step = 0;
  if (n <= 0 || std::sscanf(line, "step %llu", &step) != 1) return std::nullopt;
  return uint64_t(step);
}

void ProcessRecorder::follow_worker_batch() {
  std::optional<python::WorkerBatch> batch = python::dataloader_batch();
  if (!batch) {
    // A plain fork, not a worker loop: steps as in any process.
    if (worker_ == Worker::kMaybe) {
      worker_ = Worker::kNo;
      refresh_step_state(step());
    }
    return;
  }
  worker_ = Worker::kYes;
  if (batch->index >= 0) {
    // A persistent worker's next epoch (a fetcher made anew) numbers its batches from 0 again.
    // Its batch 0 is consumed in the step its consumer is at: the consumer drew the epoch's
    // shared seed (an op) before it handed any index out.
    const bool next_epoch = worker_epoch_ != 0 && batch->epoch != worker_epoch_;
    if (next_epoch || batch->index < worker_last_batch_) {
      if (std::optional<uint64_t> at = consumer_step()) {
        worker_base_step_ = *at;
        worker_epoch_offset_ = 0;
      } else {
        worker_epoch_offset_ += uint64_t(worker_last_batch_) + 1;
      }
    }
    worker_last_batch_ = batch->index;
    worker_epoch_ = batch->epoch;
  }
  const uint64_t s = worker_base_step_ + worker_epoch_offset_ +
                     uint64_t(std::max<int64_t>(batch->index, 0));
  if (s != step()) set_step(s);
}

trace::StepInfo ProcessRecorder::step_info() const {
  trace::StepInfo info;
  info.step = step();
  info.rng_cpu = step_rng_.load(std::memory_order_relaxed);
  info.rng_numpy = numpy_rng_.load(std::memory_order_relaxed);
  info.rng_python = python_rng_.load(std::memory_order_relaxed);
  info.intra_op_threads = uint64_t(at::get_num_threads());
  info.determinism_bits = determinism_bits();
  return info;
}

void ProcessRecorder::note_python_generators(uint64_t numpy, uint64_t python) {
  numpy_rng_.store(numpy, std::memory_order_relaxed);
  python_rng_.store(python, std::memory_order_relaxed);
}

void ProcessRecorder::register_thread(ThreadRecorder* t) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  threads_.push_back(t);
}

void ProcessRecorder::unregister_thread(ThreadRecorder* t) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (auto& p : threads_)
    if (p == t) p = nullptr;
}

void ProcessRecorder::finish_all() {
  launch_open_batches(Launch::kExit);
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (ThreadRecorder* t : threads_)
      if (t) t->finish();
  }
  StreamWriter::instance().drain();
  process_name();  // a process that recorded nothing still leaves its .status
  append_lines(status_path_, closing_status_lines(trace::ProcessEnding().line()));
  if (env_written_.load()) rewrite_environment_if_cuda_started(facts());
}

bool ProcessRecorder::exiting() const {
  return exit_started_.load() || (is_python_ && python::exiting());
}

void ProcessRecorder::note_lost_stream(const std::string& path, int err) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  if (lost_streams_.empty()) {
    const std::string line = "detaudit: error: cannot write the trace " + path + ": " +
                             std::strerror(err) + "; that thread is not recorded\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
  lost_streams_.push_back(path + ": " + std::strerror(err));
}

// What the .status says last: counters, streams lost to the disk, and how the process ended.
std::vector<std::string> ProcessRecorder::closing_status_lines(const std::string& ending) {
  std::vector<std::string> lines = {device_digest_status(), md5_batch_status(),
                                    host_known_outputs_status(), torch_pool_status()};
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    for (const std::string& lost : lost_streams_) lines.push_back("stream not recorded: " + lost);
  }
  const std::string write_error = StreamWriter::instance().first_write_error();
  if (!write_error.empty()) lines.push_back("trace write failed: " + write_error);
  if (const uint64_t spread = spread_step_states_.load())
    lines.push_back("step states: " + std::to_string(spread) +
                    " hashed across torch's intra-op threads");
  if (lean_from_.load() != UINT64_MAX) {
    lines.push_back("sentinel: no op seen outside the optimizer from step " +
                    std::to_string(lean_from_.load()) + ", the loss taken from its backward mark");
    std::lock_guard<std::mutex> lock(lean_stop_mu_);
    if (!lean_stop_.empty()) lines.push_back("sentinel: every op seen again " + lean_stop_);
  }
  lines.push_back(ending);
  return lines;
}

void ProcessRecorder::save_on_signal(int sig, ThreadRecorder* stopped) {
  // No lock: the stopped thread may hold it. The other threads keep running meanwhile; each
  // buffer is saved up to its last whole record.
  const bool stop = sig == SIGTERM || sig == SIGINT;
  const bool is_exiting = exiting();
  // Digests already on a device first: the records that wait for them are then whole.
  launch_open_batches(Launch::kSignal, /*max_wait_ms=*/1000);
  drain_device_digests_for(2000);
  std::vector<ThreadRecorder*> threads;
  std::vector<StreamBuffer*> streams;
  for (ThreadRecorder* t : threads_)
    if (t) {
      threads.push_back(t);
      streams.push_back(t->stream());
    }
  // A crash ends the recording for good; a stop signal only once the program's work is done.
  const bool close_streams = !stop || is_exiting;
  StreamBuffer* own = stopped ? stopped->stream() : nullptr;
  const size_t own_saved = StreamWriter::instance().freeze_and_save(
      streams, own,
      [&](size_t i, long max_wait_ms) { threads[i]->release_held_for_save(max_wait_ms); },
      /*budget_ms=*/5000,  // with the device drain's 2 s, inside the handler's 10 s
      [&](size_t i) {
        if (close_streams) threads[i]->close_for_signal(sig, is_exiting, /*stopped=*/false);
      });
  trace::ProcessEnding ending;
  ending.how = stop ? trace::ProcessEnding::How::kInterrupted : trace::ProcessEnding::How::kKilled;
  ending.signal = trace::signal_text(sig);
  if (stopped) {
    ending.thread = stopped->stream_thread_name();
    ending.inside_op = stopped->open_op(&ending.inside_step);
  }
  ending.exiting = is_exiting;
  append_lines(status_path_, closing_status_lines(ending.line()));
  // Should the stopped thread hold its arena's lock, this waits until the handler's bound ends
  // the process, and only these records are lost.
  if (stopped) {
    stopped->save_held_after(own_saved);
    if (close_streams) stopped->close_for_signal(sig, is_exiting, /*stopped=*/true);
  }
}

ProcessFacts ProcessRecorder::facts() const { return {rank_, role_, is_python_, config_.digest}; }

void ProcessRecorder::write_environment_once() {
  if (env_written_.exchange(true)) return;
  write_environment(streams_dir_ + "/" + process_name() + layout::kEnvExt, facts());
}

void ProcessRecorder::before_fork() {
  ++forks_;
  op_callback_mu_.lock();  // released on both sides: the child must not inherit it held
}

void ProcessRecorder::after_fork_parent() { op_callback_mu_.unlock(); }

void ProcessRecorder::after_fork_child() {
  const std::string parent = process_name_.empty() ? layout::process_name(rank_, role_)
                                                   : process_name_;
  role_ += "." + std::to_string(forks_ - 1);
  process_name_.clear();
  status_path_.clear();
  claim_note_ = "forked from " + parent + " pid " + std::to_string(::getppid());
  fork_generation_.fetch_add(1);
  forks_ = 0;
  order_.store(0);
  env_written_.store(false);
  new (&op_callback_mu_) std::mutex();
  new (&claim_mu_) std::mutex();
  new (&threads_mu_) std::mutex();  // another thread may have held it at fork time
  new (&groups_mu_) std::mutex();
  groups_.clear();
  threads_.clear();
  forget_open_batches_after_fork();
  forget_md5_batch_status();  // the .status counts this process's work
  forget_host_known_outputs_status();
  forget_torch_pool_status();
  spread_step_states_.store(0);
  StreamWriter::instance().reset_after_fork();
  if (is_python_ && op_callback_) {
    // Maybe a DataLoader worker: its batch 0 is consumed in the step that was about to begin.
    worker_ = Worker::kMaybe;
    worker_base_step_ = step() + (step_pending_.exchange(false) ? 1 : 0);
    worker_epoch_offset_ = 0;
    worker_last_batch_ = -1;
    worker_epoch_ = 0;
    parent_progress_ = streams_dir_ + "/" + parent + layout::kProgressExt;
    optimizer_window_.store(false);
    optimizer_thread_.store(0);
    switch_op_callback(true);
  }
}

}  // namespace detaudit::hooks

// Called by detaudit's Python hooks (detaudit_optimizer_steps.py, through ctypes) as each
// optimizer step ends: the interposer is loaded RTLD_GLOBAL, so the program finds it by name.
extern "C" __attribute__((visibility("default"))) void detaudit_note_python_generators(
    uint64_t numpy, uint64_t python) {
  detaudit::hooks::ProcessRecorder::instance().note_python_generators(numpy, python);
}
