// `detaudit catalog [QUERY]`: searches the catalog of known nondeterministic ops and settings
// by op name, id, remedy or condition.
#include "catalog/catalog.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/verbs.h"

namespace detaudit::cli {
namespace {

struct CatalogFlags {
  std::string query;
  std::string catalog;
  bool json = false;
};

int run_catalog(const CatalogFlags& f) {
  Catalog catalog;
  std::string path = f.catalog.empty() ? catalog_path() : f.catalog;
  if (Status s = Catalog::load(path, &catalog); !s.ok()) return report_error(s);
  std::vector<const CatalogEntry*> hits = catalog.search(f.query);
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const CatalogEntry* e : hits) out.push_back(entry_to_json(*e));
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  if (hits.empty()) {
    fmt::print("no catalog entry matches '{}'\n", f.query);
    return 0;
  }
  for (const CatalogEntry* e : hits) {
    fmt::print("{} ({}{}){}\n", e->id, e->kind, e->nondeterministic ? "" : ", deterministic",
               e->uncertain ? " [uncertain]" : "");
    if (!e->ops.empty()) fmt::print("  ops:       {}\n", fmt::join(e->ops, ", "));
    fmt::print("  device:    {}   phase: {}\n", fmt::join(e->devices, "|"),
               fmt::join(e->phases, "|"));
    if (!e->signature.empty()) fmt::print("  signature: {}\n", e->signature);
    fmt::print("  when:      {}\n", e->condition);
    for (const CatalogCondition& c : e->conditions) fmt::print("    - {}\n", c.text);
    if (e->deterministic_alternative)
      fmt::print("  alternative since {}: {}\n",
                 e->alternative_since.empty() ? "?" : e->alternative_since, e->alternative);
    fmt::print("  remedy:    {}\n", e->remedy);
    if (e->uncertain) fmt::print("  uncertain: {}\n", e->uncertainty);
    fmt::print("  sources:   {}\n\n", fmt::join(e->sources, "; "));
  }
  return 0;
}

}  // namespace

void add_catalog_verb(CLI::App& app, VerbAction* action) {
  auto flags = std::make_shared<CatalogFlags>();
  CLI::App* cmd = app.add_subcommand(
      "catalog", "Search the catalog of known nondeterministic ops and settings");
  cmd->add_option("QUERY", flags->query, "op name, id, remedy or condition text (default: all)");
  cmd->add_option("--catalog", flags->catalog, "catalog JSON (default: the installed one)");
  cmd->add_flag("--json", flags->json, "print the matching entries as JSON");
  cmd->callback([flags, action] { *action = [flags] { return run_catalog(*flags); }; });
}

}  // namespace detaudit::cli
