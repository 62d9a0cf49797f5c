// `detaudit run`: records the program N times under the interposer, then diffs run-0 with each
// other run. Flags override the config; the work is in src/run/session.h.
//
//   detaudit run --runs 2 --out audit/ -- /usr/bin/python3 train.py
//   detaudit run --config config.json --steps 0-3
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "catalog/catalog.h"
#include "cli/coverage.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "diff/risk.h"
#include "report/render.h"
#include "run/interposer.h"
#include "run/remedy.h"
#include "run/selftest.h"
#include "run/sentinel.h"
#include "run/session.h"
#include "run/validate.h"
#include "run_layout.h"
#include "util/shell_words.h"

namespace detaudit::cli {
namespace {

struct RunArgs {
  std::vector<std::function<void()>> finish;  // copy given flags into `flags` after parsing
  std::string config_path;
  bool force = false;
  bool quiet = false;
  bool verify_remedy = false;
  bool selftest = false;
  bool validate = false;
  bool coverage = false;
  double coverage_budget_s = CoverageFlags().budget_s;
  run::RunFlags flags;
};

// Every option that overrides the config is read only when given, so the config's value stands.
template <typename T>
void optional_flag(CLI::App* sub, RunArgs* args, const std::string& name, std::optional<T>* target,
                   const std::string& help) {
  auto holder = std::make_shared<T>();
  CLI::Option* opt = sub->add_option(name, *holder, help);
  args->finish.push_back([opt, holder, target] {
    if (opt->count() > 0) *target = *holder;
  });
}

// The rank this launcher's own process has (srun starts one a rank), as the recorder reads it.
std::optional<uint64_t> launcher_rank() {
  for (const char* var : {"RANK", "SLURM_PROCID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var); v && *v) return std::strtoull(v, nullptr, 10);
  return std::nullopt;
}

// The interposer's own words when it was loaded but would not record ("detaudit: error: ...;
// recording is off for this process": a config it cannot read), from the run's output.log.
std::string interposer_refusal(const std::string& run_dir) {
  constexpr std::string_view kPrefix = "detaudit: error: ";
  std::ifstream in(std::filesystem::path(run_dir) / layout::kOutputLog);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(kPrefix, 0) == 0 &&
        line.find("recording is off for this process") != std::string::npos)
      return line.substr(kPrefix.size());
  return "";
}

void print_run_problem(const run::RunOutcome& o, int index, const RangeSet& selected_ranks) {
  if (!o.result.succeeded()) {
    fmt::print(stderr, "detaudit: run-{} failed ({}): {}; what it recorded is kept\n", index,
               o.result.describe(), o.dir);
    for (const auto& [process, ending] : o.endings)
      fmt::print(stderr, "detaudit: run-{}: {} {}\n", index, process,
                 ending.empty() ? "ended without a word (SIGKILL, the OOM killer, or a lost node)"
                                : ending);
  }
  if (!o.streams.empty()) return;
  if (o.statuses.empty() && !selected_ranks.all()) {
    // A rank outside the selection is not recorded, and leaves nothing behind by design.
    const std::string chosen = selected_ranks.to_json().dump();
    if (std::optional<uint64_t> rank = launcher_rank(); rank && !selected_ranks.contains(*rank))
      fmt::print(stderr,
                 "detaudit: run-{}: rank {} is not among the ranks chosen ({}): not recorded\n",
                 index, *rank, chosen);
    else
      fmt::print(stderr,
                 "detaudit: run-{} recorded no trace in {}/streams: none of its processes had a "
                 "rank among those chosen ({}), or the interposer was not loaded\n",
                 index, o.dir, chosen);
    return;
  }
  if (o.statuses.empty()) {
    if (std::string refusal = interposer_refusal(o.dir); !refusal.empty()) {
      fmt::print(stderr,
                 "detaudit: run-{} recorded no trace: the interposer was loaded, and said: {}\n",
                 index, refusal);
      return;
    }
    fmt::print(stderr,
               "detaudit: run-{} recorded no trace and the interposer left no status in "
               "{}/streams: it was not loaded (static binary, or LD_PRELOAD cleared?)\n",
               index, o.dir);
    return;
  }
  for (const auto& [process, status] : o.statuses)
    fmt::print(stderr, "detaudit: run-{} recorded no trace; {}: {}\n", index, process, status);
}

// Where the report of pair (0, i) goes: --output as given for one pair, else one file per pair.
std::string report_path(const std::string& output, int index, int runs) {
  if (output.empty() || runs <= 2) return output;
  std::filesystem::path p(output);
  return (p.parent_path() /
          fmt::format("{}.run-{}{}", p.stem().string(), index, p.extension().string()))
      .string();
}

// The catalog explains divergences; without it detaudit still finds them, so only warn.
bool load_catalog_or_warn(Catalog* catalog) {
  Status s = Catalog::load(catalog_path(), catalog);
  if (!s.ok())
    fmt::print(stderr, "detaudit: warning: {}; divergences are reported without explanations\n",
               s.message());
  return s.ok();
}

// The single run's risk report, in the configured format, to --output or stdout.
int write_risk_report(const Config& config, const RiskReport& risk) {
  ReportFormat format;
  if (Status s = parse_report_format(config.format, &format); !s.ok()) return report_error(s);
  const bool to_file = !config.output.empty();
  std::string text = format == ReportFormat::kHtml ? render_risk_html(risk)
                     : format == ReportFormat::kJson
                         ? risk_report_to_json(risk).dump(
                               2, ' ', false, nlohmann::json::error_handler_t::replace) +
                               "\n"
                         : render_risk_report(risk, !to_file && isatty(STDOUT_FILENO));
  // Replicas that disagree are a divergence one run shows: the gate fails on it.
  const int code = risk.replicas.divergence ? int(ExitCode::kDivergent) : 0;
  if (!to_file) {
    fmt::print("{}", text);
    return code;
  }
  std::ofstream out(config.output);
  out << text;
  if (!out)
    return report_error(
        Status::error(fmt::format("cannot write report {}", config.output), ExitCode::kBadInput));
  fmt::print(stderr, "detaudit: risk report written to {}\n", config.output);
  return code;
}

// Diffs run-0 with each other run and prints or writes each report. `before_render` sees run-0
// vs run-1's report first (--verify-remedy adds to it).
int diff_pairs(const Config& config, const std::vector<std::string>& dirs,
               const std::vector<bool>& recorded,
               const std::function<void(DiffReport*)>& before_render = nullptr) {
  ReportFormat format;
  if (Status s = parse_report_format(config.format, &format); !s.ok()) return report_error(s);
  DiffOptions options;
  options.gate = config.gate;
  options.progress = isatty(STDERR_FILENO);
  Catalog catalog;
  if (load_catalog_or_warn(&catalog)) options.catalog = &catalog;
  int worst = 0;
  for (size_t i = 1; i < dirs.size(); ++i) {
    if (!recorded[0] || !recorded[i]) {
      // Already explained above by print_run_problem; a diff would only repeat it.
      worst = std::max(worst, report_error(Status::error(
                                  fmt::format("cannot diff run-0 with run-{}: run-{} recorded no "
                                              "trace",
                                              i, recorded[0] ? i : 0),
                                  ExitCode::kBadInput)));
      continue;
    }
    DiffReport report;
    if (Status s = diff_runs(dirs[0], dirs[i], options, &report); !s.ok()) {
      worst = std::max(worst, report_error(s));
      continue;
    }
    if (before_render && i == 1) before_render(&report);
    std::string path = report_path(config.output, int(i), config.runs);
    if (path.empty()) {
      if (dirs.size() > 2) fmt::print("== run-0 vs run-{}\n", i);
      bool color = format == ReportFormat::kText && isatty(STDOUT_FILENO);
      fmt::print("{}", render_report(report, format, color));
    } else {
      std::ofstream out(path);
      out << render_report(report, format, false);
      if (!out) {
        worst = std::max(worst,
                         report_error(Status::error(fmt::format("cannot write report {}", path),
                                                    ExitCode::kBadInput)));
        continue;
      }
      fmt::print(stderr, "detaudit: report for run-0 vs run-{} written to {}\n", i, path);
    }
    say_if_incomplete(report);
    worst = std::max(worst, int(gate_exit_code(report)));
  }
  return worst;
}

// `run --verify-remedy`'s verification for the report (run/remedy.h), its error said.
RemedyVerification verify_remedies(const Config& config, const run::RunOptions& options,
                                   const DiffReport& report) {
  Catalog catalog;
  const bool have_catalog = Catalog::load(catalog_path(), &catalog).ok();
  RemedyVerification verification;
  if (Status s = run::verify_remedies(
          config, options, have_catalog ? &catalog : nullptr, report,
          [&](const run::RunOutcome& o, int i) { print_run_problem(o, i, config.select.ranks); },
          &verification);
      !s.ok())
    report_error(s);
  return verification;
}

// `run --selftest`'s plants and their outcomes for the report (run/selftest.h), its error said.
SelfTest run_selftest(const Config& config, const run::RunOptions& options,
                      const std::string& run0) {
  Catalog catalog;
  const bool have_catalog = Catalog::load(catalog_path(), &catalog).ok();
  SelfTest selftest;
  if (Status s = run::run_selftest(
          config, options, run0, have_catalog ? &catalog : nullptr,
          [&](const run::RunOutcome& o, int i) { print_run_problem(o, i, config.select.ranks); },
          &selftest);
      !s.ok()) {
    report_error(s);
    selftest.outcome = "FAILED: " + s.message();
  }
  return selftest;
}

// The config from --config and the flags, and the interposer to load; a nonzero return is the
// exit code, the error already said.
int prepare_recording(const RunArgs& args, Config* config, run::RunOptions* options) {
  if (!args.config_path.empty())
    if (Status s = load_config(args.config_path, config); !s.ok()) return report_error(s);
  if (Status s = run::apply_run_flags(args.flags, config); !s.ok()) return report_error(s);
  if (Status s = run::validate_for_run(*config); !s.ok()) return report_error(s);

  options->version = DETAUDIT_VERSION;
  options->force = args.force;
  options->echo = !args.quiet;
  const std::string explicit_library = explicit_hooks_library();
  if (!explicit_library.empty() && access(explicit_library.c_str(), R_OK) != 0)
    return report_error(Status::error(
        fmt::format("interposer library not found: {} (unset DETAUDIT_HOOKS to use the ones "
                    "built in {})",
                    explicit_library, interposers_dir())));
  if (Status s = run::choose_interposer(*config, explicit_library, interposers_dir(), source_dir(),
                                        &options->hooks_library);
      !s.ok())
    return report_error(s);
  if (!config->digest_chosen) {
    // A CUDA run's tensors are digested on their GPU, with no copy and no synchronization.
    run::InterposerBuild build;
    if (run::read_interposer_build(
            std::filesystem::path(options->hooks_library).parent_path().string(), &build)
            .ok() &&
        run::default_digest(*config, build) == trace::DigestAlgo::kDevice) {
      config->digest = trace::DigestAlgo::kDevice;
      if (!args.quiet)
        fmt::print(
            stderr,
            "detaudit: digest: device (a CUDA torch and a GPU; --digest md5 hashes host copies)\n");
    }
  }
  return 0;
}

// A sentinel only finds the step: unless chosen, its digest is the fastest one (a sentinel
// baseline's too, so that a later sentinel run compares with it); the step's full recording
// goes back to md5 (localize_divergent_step).
void use_sentinel_digest(Config* config) {
  if (config->sentinel && !config->digest_chosen && config->digest == trace::DigestAlgo::kMd5)
    config->digest = trace::DigestAlgo::kXxh3;
}

int run_main(const RunArgs& args) {
  Config config;
  run::RunOptions options;
  if (int code = prepare_recording(args, &config, &options)) return code;

  use_sentinel_digest(&config);
  if ((args.selftest || args.validate) && config.runs < 2)
    return report_error(Status::error(fmt::format("{} checks a verdict: give --runs 2",
                                                  args.selftest ? "--selftest" : "--validate"),
                                      ExitCode::kUsage));

  // Before anything starts: --out is ours alone and can be written.
  run::OutLock out_lock;
  if (Status s = out_lock.acquire(config.out, "detaudit run"); !s.ok()) return report_error(s);
  for (int i = 0; i < config.runs; ++i)
    if (Status s = run::check_run_dir(run::run_dir_path(config, i), args.force); !s.ok())
      return report_error(s);

  bool any_failed = false;
  bool disk_full = false;
  std::vector<std::string> dirs;
  std::vector<bool> recorded;
  for (int i = 0; i < config.runs; ++i) {
    run::RunOutcome outcome;
    if (Status s = run::execute_run(config, options, i, &outcome); !s.ok()) {
      report_error(s);
      // The disk filled in an earlier run: that is what to fix, and what was recorded is kept.
      if (std::string full = run::full_disk_note(config.out); !full.empty()) {
        fmt::print(stderr,
                   "detaudit: error: run-{} could not start: {}; free space or choose "
                   "another --out (exit 5)\n",
                   i, full);
        return int(ExitCode::kIncomplete);
      }
      return int(s.code());
    }
    dirs.push_back(outcome.dir);
    recorded.push_back(!outcome.streams.empty());
    print_run_problem(outcome, i, config.select.ranks);
    any_failed = any_failed || !outcome.result.succeeded();
    if (std::string full = run::full_disk_note(outcome.dir); !full.empty()) {
      // The program went on; its trace stops where the disk refused it. Said now: the diff
      // below names the cut streams.
      disk_full = true;
      fmt::print(stderr,
                 "detaudit: error: run-{}'s trace is cut where the disk refused it, {}; "
                 "free space or choose another --out (exit 5)\n",
                 i, full);
    }
    if (int sig = run::interrupted()) {
      fmt::print(stderr, "detaudit: stopped by {} after run-{}; no further runs, no diff\n",
                 run::signal_name(sig), i);
      return int(ExitCode::kTargetFailed);
    }
  }

  int code = 0;
  if (config.runs >= 2) {
    // Before the report: a sentinel's divergent step recorded in full, then its remedy tried.
    auto before_render = [&](DiffReport* report) {
      if (config.sentinel && !any_failed)
        run::localize_divergent_step(run::sentinel_pair(config, options), catalog_path(), report);
      if (args.verify_remedy && !any_failed && report->verdict == Verdict::kDivergent)
        report->remedy_verification = verify_remedies(config, options, *report);
      if (args.selftest && recorded[0]) report->selftest = run_selftest(config, options, dirs[0]);
      if (args.validate) {
        Validation v;
        if (Status s = run::validate_unrecorded(
                config, options, *report,
                [&](const run::RunOutcome& o, int i) {
                  print_run_problem(o, i, config.select.ranks);
                },
                &v);
            !s.ok()) {
          report_error(s);
          v.failed = true;
          v.outcome = "NOT VALIDATED: " + s.message();
        }
        report->validation = v;
      }
    };
    code = diff_pairs(config, dirs, recorded, before_render);
  } else {
    fmt::print(stderr, "detaudit: recorded {}\n", dirs[0]);
    // One run cannot diverge yet, but the catalog says what in it could.
    Catalog catalog;
    RiskReport risk;
    if (recorded[0] && load_catalog_or_warn(&catalog)) {
      if (Status s = risk_report(dirs[0], catalog, &risk); s.ok()) {
        code = write_risk_report(config, risk);
        // One run is a gate too: a trace cut short is not a whole recording.
        if (!risk.truncated.empty() && code == 0 && !config.gate.allow_truncated) {
          fmt::print(stderr,
                     "detaudit: incomplete: {}{}; exit 5 (--allow-truncated passes on "
                     "what was recorded)\n",
                     risk.truncated.front(),
                     risk.truncated.size() > 1
                         ? fmt::format(", and {} more", risk.truncated.size() - 1)
                         : "");
          code = int(ExitCode::kIncomplete);
        }
      } else {
        code = report_error(s);
      }
    }
  }
  if (args.coverage && !any_failed && recorded[0] && !run::interrupted()) {
    // Every op type of run-0 replayed: a race that did not fire in these runs still fails.
    static const std::map<std::string, std::string> kExt = {
        {"text", "txt"}, {"json", "json"}, {"markdown", "md"}, {"junit", "xml"}, {"html", "html"}};
    CoverageFlags cf;
    cf.run = config.out;
    cf.format = kExt.count(config.format) ? config.format : "text";
    cf.output = (std::filesystem::path(config.out) / ("coverage." + kExt.at(cf.format))).string();
    cf.budget_s = args.coverage_budget_s;
    cf.fail_on = "nondeterministic";
    cf.force = true;
    const int covered = run_coverage(cf, /*take_lock=*/false);
    if (code == 0) code = covered;
  }
  if (any_failed) return int(ExitCode::kTargetFailed);
  // A divergence in what was recorded stands; anything else the full disk explains.
  if (disk_full && code != int(ExitCode::kDivergent)) return int(ExitCode::kIncomplete);
  return code;
}

// What `run` and `record` both take: what to record, and the program.
void add_recording_flags(CLI::App* sub, RunArgs* args) {
  run::RunFlags& f = args->flags;
  sub->add_option("--config", args->config_path, "JSON config (docs/config.md)")
      ->check(CLI::ExistingFile);
  optional_flag(sub, args, "--steps", &f.steps, "steps to record: \"0-3,7,10-\" or \"all\"");
  optional_flag(sub, args, "--ops", &f.ops,
                "ops to record, comma-separated globs (\"aten::*mm*\")");
  optional_flag(sub, args, "--exclude-ops", &f.exclude_ops,
                "ops not to record, comma-separated globs");
  optional_flag(sub, args, "--phases", &f.phases, "forward,backward,optimizer (default all)");
  optional_flag(sub, args, "--ranks", &f.ranks, "ranks to record: \"0,2-3\" or \"all\"");
  optional_flag(sub, args, "--digest", &f.digest,
                "md5, sha256, xxh3 or device (default: device on a CUDA run with a GPU, else md5)");
  sub->add_flag("--no-stats", f.no_stats, "do not record min/max/mean/L2 of tensors");
  sub->add_flag(
      "--rehash-inputs", f.rehash_inputs,
      "hash every input at every top-level op (programs that write tensors through NumPy)");
  sub->add_flag("--no-inputs", f.no_inputs, "record op outputs only");
  optional_flag(sub, args, "--device-batch-mib", &f.device_batch_mib,
                "MiB a thread's open batch of device digests may hold (0: a batch per op)");
  optional_flag(sub, args, "--seed", &f.seed,
                "seed torch's default generators before the first op");
  optional_flag(sub, args, "--deterministic", &f.deterministic,
                "torch.use_deterministic_algorithms: on, warn or off");
  optional_flag(sub, args, "--threads", &f.threads, "intra-op threads (torch.set_num_threads)");
  sub->add_flag("--no-mkl-vml-warm-up", f.no_mkl_vml_warm_up,
                "leave oneMKL's VML kernels unresolved until the program's first calls");
  sub->add_option("--env", f.env, "K=V for the program's environment (repeatable)")
      ->allow_extra_args(false);
  optional_flag(sub, args, "--cwd", &f.cwd, "the program's working directory");
  sub->add_flag("-q,--quiet", args->quiet, "do not echo the program's output (still logged)");
  sub->add_option("command", f.command, "the program and its arguments, after \"--\"");
}

// `detaudit record`: this node's part of one run, into a directory launchers on other nodes
// (or other SLURM tasks) write too. Two such runs are then compared with `detaudit diff`.
struct RecordArgs {
  RunArgs run;
  std::string run_dir;
  std::string node;
};

// The last line a program wrote into its log: what it said as it failed.
std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// This node's part of the run in `run_dir`, its problems said; 0, or the exit code. `if_failed`:
// what to say when the program failed, with its last line ("" for nothing more).
int record_node(const Config& config, const run::RunOptions& options, const std::string& run_dir,
                const std::string& node, const std::string& if_failed = "") {
  run::RunOutcome outcome;
  if (Status s = run::execute_node_run(config, options, run_dir, node, &outcome); !s.ok())
    return report_error(s);
  print_run_problem(outcome, run::run_index(outcome.dir), config.select.ranks);
  if (!outcome.result.succeeded() && !if_failed.empty()) {
    const std::string log =
        (std::filesystem::path(run_dir) / layout::kNodesDir / (node + ".log")).string();
    fmt::print(stderr, "detaudit: error: {}: \"{}\" (its output: {})\n", if_failed,
               last_line_of(log), log);
  }
  if (int sig = run::interrupted()) {
    fmt::print(stderr, "detaudit: stopped by {}; what node {} recorded is kept in {}\n",
               run::signal_name(sig), node, outcome.dir);
    return int(ExitCode::kTargetFailed);
  }
  fmt::print(stderr,
             "detaudit: recorded node {} ({} stream(s)) into {}; when every node has finished "
             "both runs: detaudit diff RUN_A RUN_B\n",
             node, outcome.streams.size(), outcome.dir);
  return outcome.result.succeeded() ? 0 : int(ExitCode::kTargetFailed);
}

int record_main(const RecordArgs& args) {
  Config config;
  run::RunOptions options;
  if (int code = prepare_recording(args.run, &config, &options)) return code;
  use_sentinel_digest(&config);
  return record_node(config, options, args.run_dir,
                     args.node.empty() ? run::default_node_name() : args.node);
}

}  // namespace

void add_run_verb(CLI::App& app, VerbAction* action) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "Record the program N times under the interposer, then diff the runs");
  sub->footer(
      "Examples:\n"
      "  detaudit run --runs 2 --out audit/ -- /usr/bin/python3 train.py\n"
      "  detaudit run --config config.json --steps 0-3\n"
      "Flags override the config file (docs/config.md). Put the program after \"--\".");
  run::RunFlags& f = args->flags;
  add_recording_flags(sub, args.get());
  optional_flag(sub, args.get(), "--runs", &f.runs,
                "how many times to run the program (default 1)");
  optional_flag(sub, args.get(), "--out", &f.out,
                "directory for run-0/, run-1/, ... (default audit)");
  sub->add_flag("--sentinel", f.sentinel,
                "record only each step's parameters, gradients, optimizer state and loss; with "
                "--runs 2, find the first divergent step, then record that step in full and "
                "diff it to the op");
  optional_flag(sub, args.get(), "--format", &f.format,
                "report format: text, json, junit, markdown or html");
  optional_flag(sub, args.get(), "--output", &f.output, "write the report to this file");
  optional_flag(sub, args.get(), "--fail-on", &f.fail_on, "any (default), tolerance or training");
  optional_flag(sub, args.get(), "--rtol", &f.rtol, "relative tolerance for --fail-on tolerance");
  optional_flag(sub, args.get(), "--atol", &f.atol, "absolute tolerance for --fail-on tolerance");
  optional_flag(sub, args.get(), "--ulp", &f.ulp,
                "tolerance in units of the dtype's epsilon for --fail-on tolerance");
  sub->add_flag("--allow-truncated", f.allow_truncated,
                "pass on what both runs have when a stream was cut short (default: exit 5)");
  sub->add_flag("--force", args->force, "replace run directories that already hold a run");
  sub->add_flag("--verify-remedy", args->verify_remedy,
                "after a divergent verdict, record 2 more runs with the first divergence's remedy "
                "applied (--deterministic, --threads, --seed, --env) and diff them, while remedies "
                "remain (up to 3 rounds); writes OUT/remedy.json");
  sub->add_flag("--selftest", args->selftest,
                "then prove the audit: for each of forward, backward and optimizer, one more run "
                "with one element of a value an op made changed (OUT/selftest-<phase>), which the "
                "diff must name at its op; a plant not found fails the run (exit 6)");
  sub->add_flag("--validate", args->validate,
                "then run the program twice more with nothing recorded and compare the final "
                "parameters and optimizer state they leave: a divergence recording hid fails the "
                "run (exit 6), and the sentinel's pair is tried on it (OUT/validate)");
  sub->add_flag("--coverage", args->coverage,
                "then replay every op type of run-0 on its own inputs (detaudit coverage): one "
                "verified nondeterministic fails the run (exit 1); the report goes to "
                "OUT/coverage.<format>");
  sub->add_option("--coverage-budget", args->coverage_budget_s,
                  "seconds of replaying for --coverage")
      ->capture_default_str();
  sub->callback([args, action] {
    for (auto& f : args->finish) f();
    *action = [args] { return run_main(*args); };
  });
}

void add_record_verb(CLI::App& app, VerbAction* action) {
  auto args = std::make_shared<RecordArgs>();
  CLI::App* sub = app.add_subcommand(
      "record", "Record this node's ranks into a run directory shared by every node's launcher");
  sub->footer(
      "Examples (each node, once for each of the two runs):\n"
      "  detaudit record --out /shared/audit/run-0 -- torchrun --nnodes 2 ... train.py\n"
      "  srun detaudit record --out /shared/audit/run-0 -- python train.py\n"
      "then: detaudit diff /shared/audit/run-0 /shared/audit/run-1 (docs/multi-node.md)");
  add_recording_flags(sub, &args->run);
  sub->add_option("--out", args->run_dir,
                  "the run directory every node writes into (a shared filesystem)")
      ->required();
  sub->add_option("--node", args->node,
                  "this launcher's name in the run (default: the host's name; "
                  "\"<host>.task<id>\" under srun)");
  sub->add_flag("--sentinel", args->run.flags.sentinel,
                "record only each step's parameters, gradients, optimizer state and loss: a "
                "baseline small enough to keep, for `detaudit diff BASELINE NEW`");
  sub->callback([args, action] {
    for (auto& f : args->run.finish) f();
    *action = [args] { return record_main(*args); };
  });
}

namespace {

// `detaudit resume`: the program once through into OUT/run-0, then stopped at step K and
// resumed from its checkpoint into OUT/run-1, then their diff. Hugging Face Trainer and
// Lightning are stopped and resumed by the interposer's Python side (detaudit_resume.py); a
// plain loop by the arguments its user names. Under --sentinel both record each step's state,
// and the first step that differs is recorded again in full in both (run/sentinel.h).
struct ResumeArgs {
  RecordArgs through;
  std::string out = "audit";
  uint64_t at = 0;
  std::string stop_args, resume_args;
  std::string format = "text", output;
  // Does training continue exactly? Values it does not read (a logged loss sum) are noted.
  std::string fail_on = "training";
};

// The program stopped at step `at`, then resumed from its checkpoint in `checkpoint`: one
// command, two processes.
std::vector<std::string> stopped_and_resumed(const ResumeArgs& args,
                                             const std::vector<std::string>& stop,
                                             const std::vector<std::string>& resume,
                                             const std::string& checkpoint) {
  const std::string env = fmt::format("env {}={} {}={}", layout::kEnvResumeAt, args.at,
                                      layout::kEnvResumeCheckpoint, sh_quote(checkpoint));
  return {"sh", "-c",
          fmt::format("{} {}=stop {} && {} {}=resume {}", env, layout::kEnvResume, sh_words(stop),
                      env, layout::kEnvResume, sh_words(resume))};
}

// `resume --sentinel`'s pair to localise: the run through and the stopped and resumed one,
// recorded again with some steps in full, and compared from the resume step.
run::SentinelPair resumed_pair(const ResumeArgs& args, const Config& through, const Config& resumed,
                               const run::RunOptions& options) {
  run::SentinelPair pair;
  pair.out = args.out;
  pair.diff.gate = through.gate;
  pair.diff.gate.fail_on = args.fail_on;
  pair.diff.resume_step = args.at;
  pair.record_in_full = [through, resumed, options](const std::string& steps,
                                                    const std::string& dir,
                                                    std::vector<std::string>* dirs) {
    for (const Config* side : {&through, &resumed}) {
      Config full;
      if (Status st = run::recorded_in_full(*side, steps, &full); !st.ok()) return st;
      const std::string run_dir = fmt::format("{}/run-{}", dir, dirs->size());
      std::error_code ec;
      std::filesystem::remove_all(run_dir, ec);  // ours: inside --out
      if (int code = record_node(full, options, run_dir, run::default_node_name()))
        return Status::error(fmt::format("recording {} failed", run_dir), ExitCode(code));
      dirs->push_back(run_dir);
    }
    return Status();
  };
  pair.command_from = [args](uint64_t from) {
    std::string cmd = fmt::format("detaudit resume --at {} --steps {}- --out {}", args.at, from,
                                  (std::filesystem::path(args.out) / "from-step").string());
    if (!args.stop_args.empty()) cmd += " --stop-args " + sh_quote(args.stop_args);
    if (!args.resume_args.empty()) cmd += " --resume-args " + sh_quote(args.resume_args);
    return cmd + " -- " + sh_words(args.through.run.flags.command);
  };
  return pair;
}

int resume_main(ResumeArgs args) {
  const std::vector<std::string> program = args.through.run.flags.command;
  if (program.empty())
    return report_error(Status::error("resume: give the program after \"--\"", ExitCode::kUsage));
  std::error_code ec;
  for (const char* run : {"run-0", "run-1"}) {
    const std::filesystem::path dir = std::filesystem::path(args.out) / run;
    if (!std::filesystem::exists(dir, ec)) continue;
    if (!args.through.run.force)
      return report_error(Status::error(
          fmt::format("{} already holds a run: give another --out, or --force to replace it",
                      dir.string()),
          ExitCode::kUsage));
    std::filesystem::remove_all(dir, ec);
  }
  std::vector<std::string> stop_words, resume_words;
  if (Status s = split_shell_words(args.stop_args, "--stop-args", &stop_words); !s.ok())
    return report_error(s);
  if (Status s = split_shell_words(args.resume_args, "--resume-args", &resume_words); !s.ok())
    return report_error(s);
  Config through;
  run::RunOptions options;
  if (int code = prepare_recording(args.through.run, &through, &options)) return code;
  use_sentinel_digest(&through);
  // Trainer's and Lightning's checkpoint at step K, in the run's directory: the resumed process
  // is pointed there, whatever path the program computes (detaudit_resume.py).
  const std::filesystem::path ckpt = std::filesystem::absolute(std::filesystem::path(args.out) /
                                                               "resume-checkpoint");
  std::filesystem::remove_all(ckpt, ec);
  std::filesystem::create_directories(ckpt, ec);
  std::vector<std::string> stop = program, resume = program;
  stop.insert(stop.end(), stop_words.begin(), stop_words.end());
  resume.insert(resume.end(), resume_words.begin(), resume_words.end());
  Config resumed = through;
  resumed.target.command = stopped_and_resumed(args, stop, resume, ckpt.string());
  const std::string node = run::default_node_name();
  if (int code = record_node(through, options, args.out + "/run-0", node,
                             "the program failed running through, before any resume"))
    return code;
  if (int code = record_node(
          resumed, options, args.out + "/run-1", node,
          fmt::format("the program stopped at step {} and resumed failed; check that "
                      "--resume-args load what --stop-args saved (exit 4)",
                      args.at)))
    return code;
  ResumedDiff diff;
  diff.run_a = args.out + "/run-0";
  diff.run_b = args.out + "/run-1";
  diff.format = args.format;
  diff.output = args.output;
  diff.fail_on = args.fail_on;
  if (through.sentinel) {
    // The sentinel's streams hold no read that tells the resume step: it is the one asked.
    diff.resume_step = args.at;
    diff.before_render = [&](DiffReport* report) {
      run::localize_divergent_step(resumed_pair(args, through, resumed, options), catalog_path(),
                                   report);
    };
  }
  return diff_resumed_runs(diff);
}

}  // namespace

void add_resume_verb(CLI::App& app, VerbAction* action) {
  auto args = std::make_shared<ResumeArgs>();
  CLI::App* sub = app.add_subcommand(
      "resume", "Audit a checkpoint: run through, run stopped at step K and resumed, then diff");
  sub->footer(
      "Examples:\n"
      "  detaudit resume --at 10 -- python train_with_trainer.py      (Hugging Face Trainer)\n"
      "  detaudit resume --at 10 -- python train_with_lightning.py    (Lightning)\n"
      "  detaudit resume --at 10 --stop-args \"--stop-at 10 --save ck.pt\" \\\n"
      "      --resume-args \"--resume ck.pt\" -- python train.py     (a loop of your own)\n"
      "README: \"Does my checkpoint resume exactly?\"");
  add_recording_flags(sub, &args->through.run);
  sub->add_option("--out", args->out, "directory for run-0/ (through) and run-1/ (resumed)");
  sub->add_flag("--sentinel", args->through.run.flags.sentinel,
                "record only each step's parameters, gradients, optimizer state and loss, then "
                "the first step that differs in full, in both, and diff it to the op");
  sub->add_option("--at", args->at, "the step to stop at and resume from")->required();
  sub->add_option("--stop-args", args->stop_args,
                  "arguments that make the program save and stop at that step (a loop of your "
                  "own; Trainer and Lightning are stopped without any)");
  sub->add_option("--resume-args", args->resume_args,
                  "arguments that make the program resume from its checkpoint");
  sub->add_option("--format", args->format, "report format: text, json, junit, markdown or html");
  sub->add_option("-o,--output", args->output, "write the report to this file");
  sub->add_option("--fail-on", args->fail_on,
                  "training (default): fails when the training state differs; any: on any "
                  "difference, a logged value's included")
      ->check(CLI::IsMember({"training", "any"}))
      ->capture_default_str();
  sub->add_flag("--force", args->through.run.force,
                "replace run directories that already hold a run");
  sub->callback([args, action] {
    for (auto& f : args->through.run.finish) f();
    *action = [args] { return resume_main(*args); };
  });
}

}  // namespace detaudit::cli
