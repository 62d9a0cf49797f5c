// `detaudit replay RUN (--first-divergence | --op STREAM:N)`: captures the op's inputs from a new
// run of the recorded command, calls the op again and again on them in a fresh process, and says
// whether its nondeterminism is reproduced and whether the remedy removes it (src/replay/).
#include "replay/replay.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <memory>

#include "catalog/catalog.h"
#include "cli/capture_run.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "run/launcher.h"
#include "run/session.h"
#include "run_layout.h"
#include "trace/format.h"

namespace detaudit::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

struct ReplayFlags {
  std::string run;
  bool first_divergence = false;
  std::string op;
  int replays = 20;
  int capture_runs = 3;
  std::string out;
  std::string format = "text";
  std::string output;
  bool force = false;
};

// The op the reports named first, in run A's numbering.
Status first_divergence_of(const std::string& run_a, const std::string& run_b, std::string* stream,
                           uint64_t* index) {
  Catalog catalog;
  DiffOptions options;
  if (Catalog::load(catalog_path(), &catalog).ok()) options.catalog = &catalog;
  DiffReport report;
  if (Status s = diff_runs(run_a, run_b, options, &report); !s.ok()) return s;
  if (!report.first)
    return Status::error(fmt::format("{} and {}: no first divergence to replay (verdict: {})",
                                     run_a, run_b, report.verdict));
  *stream = report.first->stream;
  *index = report.first->index;
  return Status();
}

// One series: the replayer in a fresh process, under the program's environment without the
// interposer.
Status replay_series(const CaptureRun& c, const std::string& setting, int threads,
                     bool deterministic, bool busy, const ReplayFlags& f,
                     replay::ReplayReport* report) {
  std::vector<std::string> argv = {
      c.replayer,  report->inputs_file,       report->target.op, "",
      "--replays", std::to_string(f.replays), "--deterministic", deterministic ? "on" : "off",
      "--digest",  report->target.digest};
  std::ifstream capture(fs::path(report->inputs_file).parent_path() / "capture.json");
  json cap = json::parse(capture, nullptr, false);
  if (cap.is_object()) {
    argv[3] = cap.value("overload", "");
    if (std::string rng = cap.value("rng_file", ""); !rng.empty())
      argv.insert(argv.end(), {"--rng", rng});
  }
  if (threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads)});
  if (busy) argv.push_back("--busy-thread");
  std::string out;
  int exit_code = 0;
  if (Status s = run::capture_output(argv, c.replayer_env, "", &out, &exit_code); !s.ok()) return s;
  const size_t brace = out.rfind("\n{");
  const std::string line = out.substr(brace == std::string::npos ? 0 : brace + 1);
  json j = json::parse(line, nullptr, false);
  if (exit_code != 0 || !j.is_object())
    return Status::error(
        fmt::format("{} failed (exit {}) on {}", c.replayer, exit_code, report->inputs_file),
        ExitCode::kBadInput);
  return replay::add_series(setting, j, report);
}

int run_replay(const ReplayFlags& f) {
  if (f.first_divergence == !f.op.empty())
    return report_error(
        Status::error("name the op: --first-divergence or --op STREAM:N (one of them)"));
  if (f.format != "text" && f.format != "json" && f.format != "markdown" && f.format != "junit" &&
      f.format != "html")
    return report_error(Status::error(
        fmt::format("--format: expected text, json, markdown, junit or html, got '{}'", f.format)));
  if (f.replays < 2) return report_error(Status::error("--replays must be at least 2"));
  if (f.capture_runs < 1) return report_error(Status::error("--capture-runs must be at least 1"));
  CaptureRun c;
  if (Status s = find_recorded_run(f.run, &c); !s.ok()) return report_error(s);
  const fs::path& root = c.root;
  const std::string& run_a = c.run;
  std::error_code ec;

  std::string stream;
  uint64_t index = 0;
  if (f.first_divergence) {
    if (!c.audit || !fs::exists(root / "run-1" / layout::kRunJson, ec))
      return report_error(Status::error(fmt::format(
          "--first-divergence: {} has no run-0 and run-1 to diff; record two runs with `detaudit "
          "run --runs 2 --out {}`, or name the op with --op",
          f.run, f.run)));
    if (Status s = first_divergence_of(run_a, (root / "run-1").string(), &stream, &index); !s.ok())
      return report_error(s);
  } else if (Status s = replay::parse_op_ref(f.op, &stream, &index); !s.ok()) {
    return report_error(s);
  }

  replay::ReplayReport report;
  if (Status s = replay::find_replay_target(run_a, stream, index, &report.target); !s.ok())
    return report_error(s);
  if (trace::is_compiled_kernel(report.target.op))
    return report_error(Status::error(fmt::format(
        "{} is a kernel torch.compile generated: its code lives in the program's compile cache, "
        "where no other process can call it, so it cannot be replayed alone; check the remedy "
        "with `detaudit run --runs 2 --verify-remedy` instead",
        report.target.op)));

  if (Status s = prepare_capture_run(f.out, "replay", f.force, "detaudit replay", true, &c);
      !s.ok())
    return report_error(s);
  const std::string& capture_dir = c.capture_dir;
  set_capture_spec(replay::capture_spec_json(report.target, capture_dir), &c);
  // A nondeterministic op upstream sends some runs down another path: those are run again.
  for (int attempt = 1; attempt <= f.capture_runs; ++attempt) {
    fmt::print(stderr, "detaudit: running the recorded command again to capture {} #{} {}{}\n",
               report.target.stream, report.target.index, report.target.op,
               attempt > 1 ? fmt::format(" (run {} of at most {})", attempt, f.capture_runs) : "");
    fs::remove(fs::path(capture_dir) / "capture.json", ec);
    run::RunOutcome outcome;
    if (Status s = run::execute_run(c.config, c.options, 0, &outcome); !s.ok())
      return report_error(s);
    replay::read_capture(capture_dir, &report);
    report.capture_runs = attempt;
    if (!replay::capture_may_succeed_again(report)) break;
    fmt::print(stderr, "detaudit: not captured ({}): {}\n", report.capture_status,
               report.capture_why);
  }
  if (report.capture_status == "saved") {
    const int threads = report.target.intra_op_threads;
    struct Setting {
      const char* name;
      int threads;
      bool deterministic, busy;
    };
    for (const Setting& s :
         {Setting{"as recorded", threads, report.target.deterministic, false},
          Setting{"under contention", std::max(2, 2 * threads), report.target.deterministic, true},
          Setting{"under the remedy", threads, true, false}})
      if (Status st = replay_series(c, s.name, s.threads, s.deterministic, s.busy, f, &report);
          !st.ok())
        return report_error(st);
  }
  replay::judge(&report);

  const std::string text = f.format == "json"       ? replay::report_to_json(report).dump(2) + "\n"
                           : f.format == "markdown" ? replay::render_markdown(report)
                           : f.format == "junit"    ? replay::render_junit(report)
                           : f.format == "html"     ? replay::render_html(report)
                                                    : replay::render_text(report);
  if (f.output.empty()) {
    fmt::print("{}", text);
  } else {
    std::ofstream o(f.output, std::ios::binary | std::ios::trunc);
    o << text;
    if (!o.good())
      return report_error(Status::error(fmt::format("{}: cannot write the report", f.output)));
    fmt::print("detaudit replay: {} (report: {})\n", report.evidence_line, f.output);
  }
  return report.capture_status == "saved" ? 0 : int(ExitCode::kNotCaptured);
}

}  // namespace

void add_replay_verb(CLI::App& app, VerbAction* action) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay one recorded op on its own inputs: is its nondeterminism real, and does "
      "the remedy remove it?");
  cmd->add_option("RUN", flags->run, "`detaudit run --out`'s directory, or one run-<i>")
      ->required();
  cmd->add_flag("--first-divergence", flags->first_divergence,
                "the op where run-0 and run-1 first diverged");
  cmd->add_option("--op", flags->op,
                  "the op at STREAM:N (as the reports number ops: r0.main.t-main:51)");
  cmd->add_option("--replays", flags->replays, "calls of the op per setting")
      ->capture_default_str();
  cmd->add_option("--capture-runs", flags->capture_runs,
                  "new runs of the command to try before giving up on one that takes the "
                  "recorded path")
      ->capture_default_str();
  cmd->add_option("--out", flags->out, "where the capture goes (default: RUN/replay)");
  cmd->add_flag("--force", flags->force, "empty --out first if it is not empty");
  cmd->add_option("--format", flags->format, "text, json, markdown, junit or html")
      ->capture_default_str();
  cmd->add_option("--output,-o", flags->output, "write the report to this file");
  cmd->callback([flags, action] { *action = [flags] { return run_replay(*flags); }; });
}

}  // namespace detaudit::cli
