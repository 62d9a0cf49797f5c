#include "run/remedy.h"

#include <fmt/format.h>

#include <algorithm>

#include "catalog/catalog.h"
#include "diff/report_model.h"

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
  const std::string& cls = f.divergence_class;
  if (cls == "nondeterministic-op") {
    const CatalogEntry* e = catalog && f.catalog ? catalog->find(f.catalog->id) : nullptr;
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
          f.op, f.remedy.empty() ? e->remedy : f.remedy);
  } else if (cls == "rng-state") {
    s.seed = 0;
  } else if (cls == "external-input" && f.hash_seed_unset) {
    s.env["PYTHONHASHSEED"] = "0";
  } else if (cls == "external-input" && f.batch_read_by.empty() && f.scalar_argument.empty()) {
    s.seed = 0;  // an unseeded shuffle or augmentation: run seeds random, NumPy and torch
  } else {
    *why_not = fmt::format("{}: the remedy is a change to the program ({})", cls,
                           f.remedy.empty() ? "see the report" : f.remedy);
  }
  return s;
}

}  // namespace detaudit::run
