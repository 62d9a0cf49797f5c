#include "run/remedy.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "catalog/catalog.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "report/render.h"

namespace detaudit::run {

bool RemedySettings::merge(const RemedySettings& o) {
  bool added = false;
  if (o.deterministic && deterministic != o.deterministic)
    deterministic = o.deterministic, added = true;
  if (o.threads && threads != o.threads) threads = o.threads, added = true;
  if (o.seed && !seed) seed = o.seed, added = true;
  for (const auto& [k, v] : o.env)
    if (env.count(k) == 0 || env[k] != v) env[k] = v, added = true;
  return added;
}

void RemedySettings::apply(Config* c) const {
  if (deterministic) c->determinism.algorithms = *deterministic;
  if (threads) c->determinism.intra_op_threads = *threads;
  if (seed) c->determinism.seed = *seed;
  for (const auto& [k, v] : env) c->target.env[k] = v;
}

std::string RemedySettings::flags() const {
  std::string out;
  if (deterministic) out += " --deterministic " + *deterministic;
  if (threads) out += fmt::format(" --threads {}", *threads);
  if (seed) out += fmt::format(" --seed {}", *seed);
  for (const auto& [k, v] : env) out += fmt::format(" --env {}={}", k, v);
  return out.empty() ? out : out.substr(1);
}

namespace {

bool has_key(const CatalogEntry& e, std::string_view key) {
  for (const std::string& k : e.env_keys)
    if (k == key) return true;
  return false;
}

// The settings a catalog entry's remedy names, by the environment keys it explains; those with
// none fall back on the deterministic path, or one thread where there is none.
RemedySettings entry_settings(const CatalogEntry& e) {
  RemedySettings s;
  if (has_key(e, "env.CUBLAS_WORKSPACE_CONFIG")) {
    s.env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8";
    s.deterministic = "on";
  }
  if (has_key(e, "env.MKL_CBWR")) {
    // oneMKL's conditional numerical reproducibility, on a fixed thread count.
    s.env["MKL_CBWR"] = "AUTO";
    s.threads = 1;
  }
  if (has_key(e, "env.NCCL_ALGO")) {
    s.env["NCCL_ALGO"] = "Ring";
    s.env["NCCL_PROTO"] = "Simple";
  }
  if (has_key(e, "intra_op_threads")) s.threads = 1;
  if (!s.empty()) return s;
  const bool on_cpu = std::find_if(e.devices.begin(), e.devices.end(), [](const std::string& d) {
                        return d == "cpu" || d == "any";
                      }) != e.devices.end();
  if (e.deterministic_alternative)
    s.deterministic = "on";
  else if (on_cpu)
    s.threads = 1;  // a CPU kernel racing its own threads
  return s;         // a device kernel with no deterministic path: no setting helps
}

}  // namespace

RemedySettings remedy_settings(const FirstDivergence& f, const Catalog* catalog,
                               std::string* why_not) {
  RemedySettings s;
  why_not->clear();
  const DivergenceClass cls = f.divergence_class;
  if (cls == DivergenceClass::kNondeterministicOp) {
    const CatalogEntry* e = catalog && f.explanation.catalog
                                ? catalog->find(f.explanation.catalog->id)
                                : nullptr;
    // A kernel with a deterministic path takes it in deterministic mode; one without (a CPU
    // reduction split across threads) is deterministic on one thread.
    if (e)
      s = entry_settings(*e);
    else
      s.deterministic = "on";
    if (s.empty())
      *why_not = fmt::format(
          "{} has no deterministic implementation and no setting removes its "
          "nondeterminism ({})",
          f.op, f.explanation.remedy.empty() ? e->remedy : f.explanation.remedy);
  } else if (cls == DivergenceClass::kRngState) {
    s.seed = 0;
  } else if (cls == DivergenceClass::kExternalInput && f.evidence.hash_seed_unset) {
    s.env["PYTHONHASHSEED"] = "0";
  } else if (cls == DivergenceClass::kExternalInput && f.evidence.batch_read_by.empty() &&
             f.evidence.scalar_argument.empty()) {
    s.seed = 0;  // an unseeded shuffle or augmentation: run seeds random, NumPy and torch
  } else {
    *why_not = fmt::format("{}: the remedy is a change to the program ({})", cls,
                           f.explanation.remedy.empty() ? "see the report" : f.explanation.remedy);
  }
  return s;
}

namespace {

// One round's line in the verification: its flags, runs, verdict and first divergence.
RemedyVerification::Round round_of(int round, const RemedySettings& applied,
                                   const std::string& runs, const DiffReport& report) {
  RemedyVerification::Round k;
  k.round = round;
  k.flags = applied.flags();
  k.runs = runs;
  k.verdict = report.verdict;
  if (report.first)
    k.first = fmt::format("{} step {} {} ({})", report.first->stream, report.first->step,
                          report.first->op, report.first->divergence_class);
  return k;
}

}  // namespace

Status record_and_diff_pair(const Config& c, const RunOptions& options, const Catalog* catalog,
                            const RemedyRunFn& on_run, bool* recorded, DiffReport* report) {
  std::vector<std::string> dirs;
  *recorded = true;
  for (int i = 0; i < 2; ++i) {
    RunOutcome o;
    if (Status s = execute_run(c, options, i, &o); !s.ok()) return s;
    if (on_run) on_run(o, i);
    *recorded = *recorded && !o.streams.empty() && o.result.succeeded();
    dirs.push_back(o.dir);
  }
  if (!*recorded) return Status();
  DiffOptions diff_options;
  diff_options.gate = c.gate;
  diff_options.catalog = catalog;
  return diff_runs(dirs[0], dirs[1], diff_options, report);
}

Status verify_remedies(const Config& config, const RunOptions& options, const Catalog* catalog,
                       DiffReport report, const RemedyRunFn& on_run, RemedyVerification* out) {
  *out = RemedyVerification{};
  RemedySettings applied;
  std::string outcome = "not verified";
  for (int round = 1; round <= kMaxRemedyRounds && report.verdict != Verdict::kIdentical; ++round) {
    if (!report.first) {
      outcome = fmt::format("not verified: the runs diverge ({}) with no first op to remedy",
                            report.verdict);
      break;
    }
    std::string why_not;
    RemedySettings next = remedy_settings(*report.first, catalog, &why_not);
    if (next.empty()) {
      outcome = "not verified: " + why_not;
      break;
    }
    if (!applied.merge(next)) {
      outcome = fmt::format("NOT verified: with {} the runs still diverge at {} ({})",
                            applied.flags(), report.first->op, report.first->divergence_class);
      break;
    }
    Config c = config;
    applied.apply(&c);
    c.runs = 2;
    c.out = (std::filesystem::path(config.out) / fmt::format("remedy-{}", round)).string();
    fmt::print(stderr, "detaudit: verifying the remedy of {} ({}): 2 runs with {} in {}\n",
               report.first->op, report.first->divergence_class, applied.flags(), c.out);
    bool recorded = false;
    DiffReport next_report;
    if (Status s = record_and_diff_pair(c, options, catalog, on_run, &recorded, &next_report);
        !s.ok()) {
      out->outcome = "not verified: " + s.message();
      return s;
    }
    if (!recorded) {
      outcome = "not verified: a run with the remedy failed or recorded nothing";
      break;
    }
    out->rounds.push_back(round_of(round, applied, c.out, next_report));
    report = std::move(next_report);
    if (report.verdict == Verdict::kIdentical)
      outcome = fmt::format("verified: identical with {} ({} ops compared)", applied.flags(),
                            report.ops_compared);
    else if (report.first)
      fmt::print(stderr, "detaudit: with {} the runs still diverge: first at {} step {} {} ({})\n",
                 applied.flags(), report.first->stream, report.first->step, report.first->op,
                 report.first->divergence_class);
  }
  if (report.verdict != Verdict::kIdentical && outcome == "not verified")
    outcome = fmt::format("not verified in {} rounds", kMaxRemedyRounds);
  fmt::print(stderr, "detaudit: remedy {}\n", outcome);
  out->verified = report.verdict == Verdict::kIdentical && !out->rounds.empty();
  out->outcome = outcome;
  if (out->verified) out->flags = applied.flags();
  std::ofstream((std::filesystem::path(config.out) / "remedy.json").string())
      << remedy_verification_to_json(*out).dump(2) << "\n";
  return Status();
}

}  // namespace detaudit::run
