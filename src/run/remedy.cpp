#include "run/remedy.h"

#include <fmt/format.h>

#include "catalog/catalog.h"
#include "diff/report_model.h"

namespace detaudit::run {

bool RemedySettings::merge(const RemedySettings& o) {
  bool added = false;
  if (o.deterministic && deterministic != o.deterministic) deterministic = o.deterministic, added = true;
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

RemedySettings remedy_settings(const FirstDivergence& f, const Catalog* catalog,
                               std::string* why_not) {
  RemedySettings s;
  why_not->clear();
  const std::string& cls = f.divergence_class;
  if (cls == "nondeterministic-op") {
    const CatalogEntry* e = catalog && f.catalog ? catalog->find(f.catalog->id) : nullptr;
    // A kernel with a deterministic path takes it in deterministic mode; one without (a CPU
    // reduction split across threads, oneMKL) is deterministic on one thread.
    if (!e || e->deterministic_alternative)
      s.deterministic = "on";
    else
      s.threads = 1;
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
