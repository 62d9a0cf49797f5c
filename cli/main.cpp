// detaudit: record training runs, find where two runs first diverge, and say why.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "cli/verbs.h"

int main(int argc, char** argv) {
  CLI::App app{"detaudit: find the op where two seeded training runs first diverge, and why"};
  app.set_version_flag("--version", DETAUDIT_VERSION);
  app.require_subcommand(1);
  detaudit::cli::VerbAction action;
  detaudit::cli::add_run_verb(app, &action);
  detaudit::cli::add_record_verb(app, &action);
  detaudit::cli::add_diff_verb(app, &action);
  detaudit::cli::add_merge_verb(app, &action);
  detaudit::cli::add_show_verb(app, &action);
  detaudit::cli::add_export_verb(app, &action);
  detaudit::cli::add_catalog_verb(app, &action);
  detaudit::cli::add_replay_verb(app, &action);
  detaudit::cli::add_coverage_verb(app, &action);
  detaudit::cli::add_resume_verb(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : int(detaudit::ExitCode::kUsage);
  }
  try {
    return action();
  } catch (const std::exception& e) {
    fmt::print(stderr, "detaudit: error: {}\n", e.what());
    return int(detaudit::ExitCode::kBadInput);
  }
}
