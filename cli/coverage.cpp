// `detaudit coverage RUN`: every op type the run ran, replayed on its own inputs, sorted into
// verified nondeterministic, deterministic in N replays, and unverified (src/replay/coverage.h).
// One new run of the recorded command captures the inputs of every type at once; replayer
// processes, one per idle core's worth of threads, then replay them largest first within the
// budget.
#include "replay/coverage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "catalog/catalog.h"
#include "cli/capture_run.h"
#include "cli/coverage.h"
#include "cli/verbs.h"
#include "run/launcher.h"
#include "run/session.h"

extern char** environ;

namespace detaudit::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A replayer process whose JSON lines go to a file, read as they come.
struct Worker {
  pid_t pid = -1;
  std::vector<size_t> share;  // the rows it replays, in order
  std::string manifest, out_path;
  size_t lines_read = 0;
  bool done = false;
  int starts = 0;
};

Status spawn_worker(const std::string& replayer, const std::vector<std::string>& env, Worker* w) {
  std::vector<std::string> argv = {replayer, "--batch", w->manifest};
  std::vector<char*> args, envp;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (std::string& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, w->out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  const std::string err_path = w->out_path + ".stderr";
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawn(&w->pid, replayer.c_str(), &actions, nullptr, args.data(),
                             envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return Status::error(fmt::format("{}: cannot start it ({})", replayer, std::strerror(rc)),
                         ExitCode::kBadInput);
  ++w->starts;
  return Status();
}

bool replayed(const replay::OpTypeRow& row) { return row.series.size() >= 3; }

// A replayer that died mid-share (an op that crashes it): the row it was on is unverified with
// how it died, and a new replayer takes the rest of the share.
void restart_after_death(int status, const std::string& replayer,
                         const std::vector<std::string>& env, int replays, int64_t deadline_ms,
                         replay::CoveragePlan* plan, Worker* w) {
  auto on = std::find_if(w->share.begin(), w->share.end(),
                         [&](size_t i) { return !replayed(plan->rows[i]); });
  if (on == w->share.end()) return;
  plan->rows[*on].replay_died = WIFSIGNALED(status)
                                    ? fmt::format("the replayer died on it ({})",
                                                  run::signal_name(WTERMSIG(status)))
                                    : fmt::format("the replayer exited {} on it",
                                                  WEXITSTATUS(status));
  w->share.erase(w->share.begin(), on + 1);
  if (w->share.empty()) return;
  std::ofstream(w->manifest) << replay::replay_manifest(*plan, w->share, replays, deadline_ms)
                             << "\n";
  if (Status s = spawn_worker(replayer, env, w); s.ok()) w->done = false;
}

// New complete lines of a worker's output, into the plan.
int read_new_lines(Worker* w, replay::CoveragePlan* plan) {
  std::ifstream in(w->out_path);
  std::string line;
  size_t n = 0;
  int added = 0;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written
    if (n++ < w->lines_read) continue;
    ++w->lines_read;
    if (replay::add_replay_line(line, plan)) ++added;
  }
  return added;
}

int count_settled(const replay::CoveragePlan& plan, const std::vector<size_t>& rows) {
  int n = 0;
  for (size_t i : rows)
    if (replayed(plan.rows[i]) || !plan.rows[i].replay_died.empty()) ++n;
  return n;
}

// Replays the captured rows on `workers` replayer processes, largest first, until the deadline;
// a worker still busy a grace period after it is stopped (what it finished is kept).
void replay_rows(const std::string& replayer, const std::string& out_dir, int workers, int replays,
                 Clock::time_point deadline, const std::vector<std::string>& env, bool progress,
                 replay::CoveragePlan* plan) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < plan->rows.size(); ++i)
    if (plan->rows[i].capture_status == "saved") rows.push_back(i);
  if (rows.empty()) return;
  workers = std::max(1, std::min(workers, int(rows.size())));
  const int64_t deadline_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(
          (std::chrono::system_clock::now() + (deadline - Clock::now())).time_since_epoch())
          .count();
  std::vector<Worker> pool(static_cast<size_t>(workers));
  for (int k = 0; k < workers; ++k) {
    Worker& w = pool[size_t(k)];
    // Round robin: each worker starts with one of the largest.
    for (size_t j = size_t(k); j < rows.size(); j += size_t(workers)) w.share.push_back(rows[j]);
    w.manifest = fmt::format("{}/replay-{}.json", out_dir, k);
    w.out_path = fmt::format("{}/replay-{}.jsonl", out_dir, k);
    std::ofstream(w.manifest) << replay::replay_manifest(*plan, w.share, replays, deadline_ms)
                              << "\n";
    if (Status s = spawn_worker(replayer, env, &w); !s.ok()) {
      report_error(s);
      w.done = true;
    }
  }
  const auto grace = std::chrono::seconds(30);
  bool stopped = false;
  for (;;) {
    bool all_done = true;
    for (Worker& w : pool) {
      if (w.done) continue;
      int status = 0;
      const bool ended = waitpid(w.pid, &status, WNOHANG) == w.pid;
      read_new_lines(&w, plan);
      if (ended) {
        w.done = true;
        if (!stopped && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          restart_after_death(status, replayer, env, replays, deadline_ms, plan, &w);
      }
      all_done = all_done && w.done;
    }
    if (progress) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now());
      fmt::print(stderr, "\rdetaudit coverage: {}/{} op types replayed, {} s of the budget left  ",
                 count_settled(*plan, rows), rows.size(), std::max<int64_t>(0, left.count()));
    }
    if (all_done || run::interrupted()) break;
    if (!stopped && Clock::now() > deadline + grace) {
      stopped = true;
      for (Worker& w : pool)
        if (!w.done) ::kill(w.pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (Worker& w : pool)
    if (!w.done) {
      ::kill(w.pid, SIGKILL);
      waitpid(w.pid, nullptr, 0);
      read_new_lines(&w, plan);
    }
  if (progress) fmt::print(stderr, "\n");
}

// As many replayers as the cores hold at their busiest setting (under contention: twice the
// threads, at least 2, and a busy one). More would share cores, and a race needs its threads
// to run at once: two replayers on 2 cores hid the index_put race in 1 series of 4.
int worker_count(const replay::CoveragePlan& plan) {
  int threads = 1;
  for (const replay::OpTypeRow& row : plan.rows)
    threads = std::max(threads, row.target.intra_op_threads);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / (std::max(2, 2 * threads) + 1));
}

}  // namespace

int run_coverage(const CoverageFlags& f, bool take_lock) {
  static const char* kFormats[] = {"text", "json", "markdown", "junit", "html"};
  if (std::find(std::begin(kFormats), std::end(kFormats), f.format) == std::end(kFormats))
    return report_error(Status::error(
        fmt::format("--format: expected text, json, markdown, junit or html, got '{}'", f.format)));
  if (f.fail_on != "none" && f.fail_on != "nondeterministic")
    return report_error(Status::error(
        fmt::format("--fail-on: expected none or nondeterministic, got '{}'", f.fail_on)));
  if (f.replays < 2) return report_error(Status::error("--replays must be at least 2"));
  if (f.budget_s <= 0) return report_error(Status::error("--budget must be more than 0 seconds"));
  CaptureRun c;
  if (Status s = find_recorded_run(f.run, &c); !s.ok()) return report_error(s);
  Catalog catalog;
  if (Status s = Catalog::load(catalog_path(), &catalog); !s.ok())
    fmt::print(stderr, "detaudit: warning: {}; op types are not matched to catalog entries\n",
               s.message());
  replay::CoveragePlan plan;
  if (Status s = replay::plan_coverage(c.run, catalog, &plan); !s.ok()) return report_error(s);
  if (Status s = prepare_capture_run(f.out, "coverage", f.force, "detaudit coverage", take_lock,
                                     &c);
      !s.ok())
    return report_error(s);
  const json spec = replay::capture_targets_json(plan, c.capture_dir);
  std::error_code ec;
  for (const json& t : spec["targets"]) fs::create_directories(t["dir"].get<std::string>(), ec);
  set_capture_spec(spec, &c);

  // One new run of the recorded command, capturing every type's chosen occurrence.
  fmt::print(stderr,
             "detaudit: {} op types in {}; running the recorded command again to capture the "
             "inputs of {}\n",
             plan.rows.size(), c.run, spec["targets"].size());
  run::RunOutcome outcome;
  if (Status s = run::execute_run(c.config, c.options, 0, &outcome); !s.ok())
    return report_error(s);
  const bool capture_failed = !outcome.result.succeeded();
  if (capture_failed)
    fmt::print(stderr, "detaudit: the capture run failed ({}); what it captured is replayed\n",
               outcome.result.describe());
  replay::read_captures(c.capture_dir, &plan);

  const int workers = f.workers > 0 ? f.workers : worker_count(plan);
  const auto replay_start = Clock::now();
  const auto deadline = replay_start + std::chrono::milliseconds(int64_t(f.budget_s * 1000));
  replay_rows(c.replayer, c.out, workers, f.replays, deadline, c.replayer_env,
              isatty(STDERR_FILENO) && !f.quiet, &plan);
  const double spent = std::chrono::duration<double>(Clock::now() - replay_start).count();
  const replay::CoverageReport report = replay::judge_coverage(std::move(plan), f.replays,
                                                               f.budget_s, spent, workers);

  const std::string text = f.format == "json" ? replay::coverage_to_json(report).dump(2) + "\n"
                           : f.format == "markdown" ? replay::render_coverage_markdown(report)
                           : f.format == "junit"    ? replay::render_coverage_junit(report)
                           : f.format == "html"
                               ? replay::render_coverage_html(report)
                               : replay::render_coverage_text(
                                     report, f.output.empty() && isatty(STDOUT_FILENO));
  if (f.output.empty()) {
    fmt::print("{}", text);
  } else {
    std::ofstream o(f.output, std::ios::binary | std::ios::trunc);
    o << text;
    if (!o.good())
      return report_error(Status::error(fmt::format("{}: cannot write the report", f.output)));
    fmt::print(stderr,
               "detaudit coverage: {} verified nondeterministic, {} deterministic, {} "
               "unverified (report: {})\n",
               report.nondeterministic, report.deterministic, report.unverified, f.output);
  }
  if (f.fail_on == "nondeterministic" && report.nondeterministic > 0) {
    fmt::print(stderr,
               "detaudit: {} op type(s) verified nondeterministic: the gate fails (exit 1)\n",
               report.nondeterministic);
    return int(ExitCode::kDivergent);
  }
  return capture_failed ? int(ExitCode::kTargetFailed) : 0;
}

void add_coverage_flags(CLI::App* cmd, CoverageFlags* f) {
  cmd->add_option("--budget", f->budget_s, "seconds of replaying, spent on the largest types first")
      ->capture_default_str();
  cmd->add_option("--replays", f->replays, "calls of each op type per setting")
      ->capture_default_str();
  cmd->add_option(
      "--workers", f->workers,
      "replayer processes at once (default: as many as the cores hold under contention)");
  cmd->add_option("--fail-on", f->fail_on,
                  "none, or nondeterministic: exit 1 when an op type is verified nondeterministic")
      ->capture_default_str();
}

void add_coverage_verb(CLI::App& app, VerbAction* action) {
  auto flags = std::make_shared<CoverageFlags>();
  CLI::App* cmd = app.add_subcommand(
      "coverage",
      "Replay every op type a run ran on its own inputs: which can give different bits, even "
      "when two runs agreed?");
  cmd->add_option("RUN", flags->run, "`detaudit run --out`'s directory, or one run-<i>")
      ->required();
  add_coverage_flags(cmd, flags.get());
  cmd->add_option("--out", flags->out, "where the captures go (default: RUN/coverage)");
  cmd->add_flag("--force", flags->force, "empty --out first if it is not empty");
  cmd->add_option("--format", flags->format, "text, json, markdown, junit or html")
      ->capture_default_str();
  cmd->add_option("--output,-o", flags->output, "write the report to this file");
  cmd->add_flag("-q,--quiet", flags->quiet, "no progress line");
  cmd->callback([flags, action] { *action = [flags] { return run_coverage(*flags, true); }; });
}

}  // namespace detaudit::cli
