// `detaudit coverage`, also run by `detaudit run --coverage` after its runs.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace detaudit::cli {

struct CoverageFlags {
  std::string run;
  double budget_s = 300;
  int replays = 20;
  int workers = 0;  // 0: as many as the cores hold at the busiest setting
  std::string fail_on = "none";
  std::string out;
  std::string format = "text";
  std::string output;
  bool force = false;
  bool quiet = false;
};

// `take_lock`: false when the caller (`detaudit run`) already holds the audit's lock.
int run_coverage(const CoverageFlags& flags, bool take_lock);
// --budget, --replays, --workers and --fail-on, for both verbs.
void add_coverage_flags(CLI::App* cmd, CoverageFlags* flags);

}  // namespace detaudit::cli
