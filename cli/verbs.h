// One function per verb: each adds its subcommand and flags, and sets the action to run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "util/status.h"

namespace CLI {
class App;
}
namespace detaudit {
struct DiffReport;
}

namespace detaudit::cli {

using VerbAction = std::function<int()>;

void add_run_verb(CLI::App& app, VerbAction* action);
void add_diff_verb(CLI::App& app, VerbAction* action);
void add_show_verb(CLI::App& app, VerbAction* action);
void add_export_verb(CLI::App& app, VerbAction* action);
void add_catalog_verb(CLI::App& app, VerbAction* action);
void add_replay_verb(CLI::App& app, VerbAction* action);
void add_record_verb(CLI::App& app, VerbAction* action);
void add_merge_verb(CLI::App& app, VerbAction* action);
void add_coverage_verb(CLI::App& app, VerbAction* action);
void add_resume_verb(CLI::App& app, VerbAction* action);

// `detaudit resume`'s diff of the run that went through (A) and the resumed one (B): in
// `format` (text, json, ...), to `output` or stdout, gated on `fail_on` ("training": does
// training continue exactly?). `resume_step`: where B resumed, when its tensors cannot tell (a
// sentinel's). `before_render` may replace the report (a sentinel's step recorded in full).
struct ResumedDiff {
  std::string run_a, run_b, format, output, fail_on;
  std::optional<uint64_t> resume_step;
  std::function<void(DiffReport*)> before_render;
};
int diff_resumed_runs(const ResumedDiff& diff);

// Prints "detaudit: error: <message>" and returns the status's exit code.
int report_error(const Status& status);
// One line on stderr when a diff cannot pass because part of a run was not compared (exit 5).
void say_if_incomplete(const DiffReport& report);

// Installed and build trees share a layout: <prefix>/bin/detaudit, <prefix>/lib/detaudit/...
std::string explicit_hooks_library();  // $DETAUDIT_HOOKS, or empty
std::string interposers_dir();         // <prefix>/lib/detaudit: torch/<version>/ for each torch
std::string source_dir();              // where detaudit was built from, for build commands
std::string catalog_path();            // $DETAUDIT_CATALOG, else beside the executable

}  // namespace detaudit::cli
