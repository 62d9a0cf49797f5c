// `detaudit diff RUN_A RUN_B`: compares two recorded runs, prints or writes the report, and
// exits with the gate's code (docs/exit-codes.md).
#include "diff/diff.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "catalog/catalog.h"
#include "cli/verbs.h"
#include "diff/partial.h"
#include "diff/report_model.h"
#include "report/render.h"
#include "summary/timeline.h"

namespace detaudit::cli {
namespace {

struct DiffFlags {
  std::string run_a, run_b;
  std::vector<std::string> parts;  // merge
  std::string ranks, part;
  std::string format = "text";
  std::string output;
  std::string fail_on = "any";
  double rtol = 0, atol = 0, ulp = 0;
  std::string catalog;
  bool no_catalog = false;
  bool progress = false;
  bool allow_truncated = false;
  std::string perfetto;
  std::optional<uint64_t> resume_step;
};

// Run A's timeline with the divergent ops and the first divergence marked.
Status write_marked_timeline(const DiffReport& report, const std::string& path) {
  summary::TimelineMarks marks;
  for (const auto& [stream, orders] : report.divergent_orders)
    marks.divergent[stream].insert(orders.begin(), orders.end());
  if (report.first) {
    marks.first = std::make_pair(report.first->stream, report.first->order_a);
    marks.first_label = std::string(divergence_class_name(report.first->divergence_class)) +
                        " at " + report.first->op;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return Status::error(fmt::format("{}: cannot write the timeline", path), ExitCode::kBadInput);
  if (Status s = summary::write_timeline(report.run_a, &marks, out); !s.ok()) return s;
  if (!out.good())
    return Status::error(fmt::format("{}: cannot write the timeline", path), ExitCode::kBadInput);
  return Status();
}

// The options `diff` and `merge` share; a nonzero return is the exit code, the error said.
int diff_options(const DiffFlags& f, Catalog* catalog, DiffOptions* options) {
  if (f.fail_on != "any" && f.fail_on != "tolerance" && f.fail_on != "training")
    return report_error(Status::error(
        fmt::format("--fail-on: expected 'any', 'tolerance' or 'training', got '{}'", f.fail_on)));
  if (f.rtol < 0 || f.atol < 0 || f.ulp < 0)
    return report_error(Status::error("--rtol, --atol and --ulp must not be negative"));
  options->gate.fail_on = f.fail_on;
  options->gate.ulp = f.ulp;
  options->gate.rtol = f.rtol;
  options->gate.atol = f.atol;
  options->gate.allow_truncated = f.allow_truncated;
  options->progress = f.progress && isatty(STDERR_FILENO);
  if (!f.no_catalog) {
    std::string path = f.catalog.empty() ? catalog_path() : f.catalog;
    if (Status s = Catalog::load(path, catalog); !s.ok()) {
      // The default catalog missing is not fatal: the diff still stands, unexplained.
      if (!f.catalog.empty()) return report_error(s);
      fmt::print(stderr, "detaudit: warning: {} (no catalog explanations)\n", s.message());
    } else {
      options->catalog = catalog;
    }
  }
  return 0;
}

// Prints or writes the report; exits with the gate's code.
int emit_report(const DiffReport& report, const DiffFlags& f, ReportFormat format) {
  if (f.output.empty()) {
    bool color = format == ReportFormat::kText && isatty(STDOUT_FILENO) &&
                 std::getenv("NO_COLOR") == nullptr;
    fmt::print("{}", render_report(report, format, color));
  } else {
    std::ofstream out(f.output, std::ios::binary | std::ios::trunc);
    out << render_report(report, format, false);
    if (!out.good())
      return report_error(Status::error(fmt::format("{}: cannot write the report", f.output)));
    // Say the verdict on the terminal too, so a CI log shows it without the file.
    fmt::print("detaudit diff: {} (report: {})\n", report.verdict, f.output);
  }
  say_if_incomplete(report);
  return int(gate_exit_code(report));
}

// `diff --ranks R --part FILE`: one part of a diff split by ranks, for `merge`.
int write_part(const DiffFlags& f, const DiffOptions& options) {
  nlohmann::json part;
  if (Status s = diff_part(f.run_a, f.run_b, options, &part); !s.ok()) return report_error(s);
  std::ofstream out(f.part, std::ios::binary | std::ios::trunc);
  out << part.dump() << "\n";
  if (!out.good())
    return report_error(Status::error(fmt::format("{}: cannot write the part", f.part)));
  fmt::print(stderr,
             "detaudit diff: ranks {} of {} and {}: {} stream(s) in {} (merge the parts: "
             "detaudit merge PART...)\n",
             f.ranks.empty() ? "all" : f.ranks, f.run_a, f.run_b, part["streams"].size(), f.part);
  return 0;
}

int run_merge(const DiffFlags& f) {
  ReportFormat format;
  if (Status s = parse_report_format(f.format, &format); !s.ok()) return report_error(s);
  Catalog catalog;
  DiffOptions options;
  if (int code = diff_options(f, &catalog, &options)) return code;
  std::vector<nlohmann::json> parts;
  for (const std::string& path : f.parts) {
    std::ifstream in(path);
    if (!in)
      return report_error(Status::error(
          fmt::format("{}: cannot read the part; give the files diff --part wrote", path),
          ExitCode::kBadInput));
    parts.push_back(nlohmann::json::parse(in, nullptr, false));
    if (parts.back().is_discarded())
      return report_error(Status::error(
          fmt::format("{}: offset 0: not JSON (a corrupt part); write it again", path),
          ExitCode::kBadInput));
  }
  DiffReport report;
  if (Status s = merge_parts(parts, f.parts, options, &report); !s.ok()) return report_error(s);
  return emit_report(report, f, format);
}

int run_diff(const DiffFlags& f, const std::function<void(DiffReport*)>& before_render = nullptr) {
  ReportFormat format;
  if (Status s = parse_report_format(f.format, &format); !s.ok()) return report_error(s);
  Catalog catalog;
  DiffOptions options;
  if (int code = diff_options(f, &catalog, &options)) return code;
  if (!f.ranks.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t at = 0, comma; at <= f.ranks.size(); at = comma + 1) {
      comma = f.ranks.find(',', at);
      if (comma == std::string::npos) comma = f.ranks.size();
      if (comma > at) ranks.push_back(f.ranks.substr(at, comma - at));
    }
    if (Status s = RangeSet::parse(f.ranks == "all" ? nlohmann::json("all") : ranks, "--ranks",
                                   &options.ranks);
        !s.ok())
      return report_error(s);
  }
  options.resume_step = f.resume_step;
  if (!f.part.empty()) return write_part(f, options);
  if (!f.ranks.empty())
    return report_error(Status::error(
        "--ranks compares part of the runs: give --part FILE too, and merge the parts"));
  DiffReport report;
  if (Status s = diff_runs(f.run_a, f.run_b, options, &report); !s.ok()) return report_error(s);
  if (before_render) before_render(&report);
  if (!f.perfetto.empty())
    if (Status s = write_marked_timeline(report, f.perfetto); !s.ok()) return report_error(s);
  return emit_report(report, f, format);
}

// The report's and the gate's flags, which `diff` and `merge` share.
void add_report_flags(CLI::App* cmd, DiffFlags* flags) {
  cmd->add_option("--format", flags->format, "text, json, junit, markdown or html")
      ->capture_default_str();
  cmd->add_option("--output,-o", flags->output, "write the report to this file");
  cmd->add_option("--fail-on", flags->fail_on,
                  "any: every divergence fails; tolerance: only one beyond --rtol/--atol/--ulp; "
                  "training: only one that reaches parameters, gradients or optimizer state")
      ->capture_default_str();
  cmd->add_option("--rtol", flags->rtol, "relative tolerance on tensor statistics");
  cmd->add_option("--atol", flags->atol, "absolute tolerance on tensor statistics");
  cmd->add_option("--ulp", flags->ulp,
                  "tolerance in units of each tensor's dtype epsilon (float32 2^-23, bfloat16 "
                  "2^-7), at each statistic's scale, added to --rtol");
  cmd->add_option("--catalog", flags->catalog, "catalog JSON (default: the installed one)");
  cmd->add_flag("--no-catalog", flags->no_catalog, "do not explain with the catalog");
  cmd->add_flag("--allow-truncated", flags->allow_truncated,
                "pass on what both runs have when a stream was cut short (default: exit 5)");
}

}  // namespace

void add_diff_verb(CLI::App& app, VerbAction* action) {
  auto flags = std::make_shared<DiffFlags>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Compare two recorded runs: where they first diverged, why, and what to change");
  cmd->add_option("RUN_A", flags->run_a, "first run directory (e.g. audit/run-0)")->required();
  cmd->add_option("RUN_B", flags->run_b, "second run directory (e.g. audit/run-1)")->required();
  add_report_flags(cmd, flags.get());
  cmd->add_flag("--progress", flags->progress, "progress lines on stderr (when a terminal)");
  cmd->add_option("--perfetto", flags->perfetto,
                  "also write run A's timeline (trace-event JSON for ui.perfetto.dev) with the "
                  "divergent ops marked");
  cmd->add_option("--ranks", flags->ranks,
                  "compare these ranks' streams only (\"0-255\"), with --part: one part of a "
                  "diff split over machines");
  cmd->add_option("--part", flags->part, "write the part to this file, for detaudit merge");
  cmd->add_option(
      "--resume-step", flags->resume_step,
      "a run resumed from a checkpoint resumed at this step, where the tensors its "
      "resumed process read cannot tell (README: \"Does my checkpoint resume exactly?\")");
  cmd->callback([flags, action] { *action = [flags] { return run_diff(*flags); }; });
}

void add_merge_verb(CLI::App& app, VerbAction* action) {
  auto flags = std::make_shared<DiffFlags>();
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Merge the parts of a diff split by ranks (diff --ranks R --part FILE) into its report");
  cmd->footer(
      "Example:\n"
      "  detaudit diff A B --ranks 0-511 --part p0.json   # on one machine\n"
      "  detaudit diff A B --ranks 512- --part p1.json    # on another\n"
      "  detaudit merge p0.json p1.json --format html -o report.html");
  cmd->add_option("PART", flags->parts, "the parts' files")->required();
  add_report_flags(cmd, flags.get());
  cmd->callback([flags, action] { *action = [flags] { return run_merge(*flags); }; });
}

int diff_resumed_runs(const ResumedDiff& diff) {
  DiffFlags f;
  f.run_a = diff.run_a;
  f.run_b = diff.run_b;
  f.format = diff.format;
  f.output = diff.output;
  f.fail_on = diff.fail_on;
  f.resume_step = diff.resume_step;
  return run_diff(f, diff.before_render);
}

}  // namespace detaudit::cli
