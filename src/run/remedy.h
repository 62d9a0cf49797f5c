// A first divergence's remedy in the form `detaudit run` can apply itself, for
// `run --verify-remedy`: the settings run already has (--deterministic on, --threads N, --seed,
// environment variables), or nothing when the remedy is a change to the program.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "config/config.h"
#include "diff/report_model.h"
#include "run/session.h"
#include "util/status.h"

namespace detaudit {
class Catalog;
}  // namespace detaudit

namespace detaudit::run {

struct RemedySettings {
  std::optional<std::string> deterministic;  // "on"
  std::optional<int> threads;
  std::optional<uint64_t> seed;
  std::map<std::string, std::string> env;

  bool empty() const { return !deterministic && !threads && !seed && env.empty(); }
  // Adds what `other` sets; false if it set nothing new (the same remedy again).
  bool merge(const RemedySettings& other);
  void apply(Config* config) const;
  // "--deterministic on --threads 1 --env PYTHONHASHSEED=0", as run's flags
  std::string flags() const;
};

// The remedy of `first` that run can apply, or empty settings with *why_not saying what the
// program must change instead. The catalog (may be null) says whether the op has a deterministic
// alternative; without one, one intra-op thread is the setting.
RemedySettings remedy_settings(const FirstDivergence& first, const Catalog* catalog,
                               std::string* why_not);

inline constexpr int kMaxRemedyRounds = 3;

// Told of each run recorded with a remedy, and its index (0, 1): the caller's warnings.
using RemedyRunFn = std::function<void(const RunOutcome& outcome, int index)>;

// Records runs 0 and 1 of `c` and diffs them under its gate; *recorded is false when one failed or
// recorded nothing (then nothing is diffed). The catalog may be null.
Status record_and_diff_pair(const Config& c, const RunOptions& options, const Catalog* catalog,
                            const RemedyRunFn& on_run, bool* recorded, DiffReport* report);

// `run --verify-remedy`: applies the first divergence's remedy as run's own settings, records two
// more runs into OUT/remedy-<round> and diffs them, while a divergence with such a remedy remains
// (kMaxRemedyRounds at most). Says what it found on stderr and in OUT/remedy.json (the report's
// "remedy_verification"). A run or diff that fails ends it with that error; *out then says why
// it is not verified. The catalog may be null.
Status verify_remedies(const Config& config, const RunOptions& options, const Catalog* catalog,
                       DiffReport report, const RemedyRunFn& on_run, RemedyVerification* out);

}  // namespace detaudit::run
