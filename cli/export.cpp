// `detaudit export RUN`: every record of a run as JSON Lines, for people, jq and pandas.
//
//   detaudit export audit/run-0 --output run0.jsonl
//   pandas.read_json("run0.jsonl", lines=True)
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/verbs.h"
#include "summary/summary.h"
#include "summary/timeline.h"

namespace detaudit::cli {
namespace {

struct ExportArgs {
  std::string run_dir;
  std::string stream;
  std::string output;
  std::string perfetto;
};

int export_main(const ExportArgs& a) {
  if (!a.perfetto.empty()) {
    // The timeline instead of the records: one file for ui.perfetto.dev or chrome://tracing.
    std::ofstream out(a.perfetto, std::ios::binary | std::ios::trunc);
    if (!out)
      return report_error(
          Status::error(fmt::format("cannot write {}", a.perfetto), ExitCode::kBadInput));
    if (Status s = summary::write_timeline(a.run_dir, nullptr, out); !s.ok())
      return report_error(s);
    out.flush();
    if (!out)
      return report_error(
          Status::error(fmt::format("cannot write {}", a.perfetto), ExitCode::kBadInput));
    fmt::print(stderr, "detaudit: timeline written to {} (open it in ui.perfetto.dev)\n",
               a.perfetto);
    return 0;
  }
  std::ofstream file;
  if (!a.output.empty()) {
    file.open(a.output);
    if (!file)
      return report_error(
          Status::error(fmt::format("cannot write {}", a.output), ExitCode::kBadInput));
  }
  std::ostream& out = a.output.empty() ? std::cout : file;
  std::vector<std::string> notes;
  Status s = summary::export_run(a.run_dir, a.stream, out, &notes);
  out.flush();
  for (const auto& n : notes) fmt::print(stderr, "detaudit: note: {}\n", n);
  if (!s.ok()) return report_error(s);
  if (!out)
    return report_error(
        Status::error(fmt::format("cannot write {}", a.output.empty() ? "to stdout" : a.output),
                      ExitCode::kBadInput));
  return 0;
}

}  // namespace

void add_export_verb(CLI::App& app, VerbAction* action) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand("export", "Write a run's records as JSON Lines");
  sub->add_option("run", args->run_dir, "a run directory (audit/run-0)")->required();
  sub->add_option("--stream", args->stream, "only this stream (r0.main.t-main)");
  sub->add_option("-o,--output", args->output, "write to this file instead of stdout");
  sub->add_option("--perfetto", args->perfetto,
                  "write the run's timeline instead (trace-event JSON: ui.perfetto.dev, "
                  "chrome://tracing)");
  sub->callback([args, action] { *action = [args] { return export_main(*args); }; });
}

}  // namespace detaudit::cli
