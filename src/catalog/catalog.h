// The catalog of known nondeterministic ops and environment settings (configs/catalog.json,
// docs/catalog.md), keyed on the names the recorder sees, with conditions checked against a
// recorded op.
//
//   Catalog c;
//   if (Status s = Catalog::load(path, &c); !s.ok()) ...
//   for (const CatalogEntry* e : c.lookup("aten::_index_put_impl_")) ...
//   CatalogMatch m = evaluate(*e, op_facts);   // which conditions the op met
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/reader.h"
#include "util/status.h"

namespace detaudit {

// One condition of an entry. Exactly one test is set: equals, contains, given, dtype, min_numel or
// min_intra_op_threads. Argument conditions name the positional input index and its name; an
// environment condition names a fingerprint key and tests it with equals.
struct CatalogCondition {
  int arg = -1;                          // positional input index; -1 when not about an argument
  std::string name;                      // argument name, for people
  std::optional<nlohmann::json> equals;  // bool, int or string
  std::string contains;                  // a string argument holds this text
  std::optional<bool> given;             // the argument is not None
  std::string dtype;                     // "float32", "floating", ...: of the tensor argument
  uint64_t min_numel = 0;                // of the tensor argument
  uint64_t min_intra_op_threads = 0;
  std::string environment;              // flattened fingerprint key ("determinism.mkl_vml_warm_up")
  std::vector<std::string> applies_to;  // op names; empty = the entry's dispatcher names
  std::string text;                     // rendered description
};

struct CatalogEntry {
  std::string id;
  std::string kind;       // "op" or "environment"
  std::vector<int> rows;  // rows of shared/reference/nondeterministic-ops.md
  // Dispatcher and autograd node names; "ns::*" is every op of namespace ns (the kernels
  // torch.compile generates are recorded as inductor_kernel::<kernel>).
  std::vector<std::string> ops;
  std::vector<std::string> devices;  // "cpu", "cuda", "xpu", "any"
  std::vector<std::string> phases;   // "forward", "backward", "optimizer", "any"
  std::string signature;  // e.g. "_index_put_impl_(self, indices, values, accumulate, unsafe)"
  std::string condition;  // as prose
  std::vector<CatalogCondition> conditions;
  std::vector<std::string> env_keys;  // environment keys this entry explains
  bool deterministic_alternative = false;
  std::string alternative_since;  // a version, or "" when none/unknown
  std::string alternative;        // how
  std::string remedy;
  std::vector<std::string> sources;
  bool uncertain = false;
  std::string uncertainty;       // what is not verified; "" when certain
  bool nondeterministic = true;  // false: listed as known-deterministic (kept for lookups)
};

// What one op looked like, for condition checks: the reader holds its tensors.
struct OpFacts {
  std::string_view name;
  const trace::OpRecord* op = nullptr;
  const trace::TraceReader* reader = nullptr;  // for strings and tensors; may be null
  uint64_t intra_op_threads = 0;               // 0 = unknown
  const std::map<std::string, std::string>* fingerprint = nullptr;  // its process's; may be null
};

enum class ConditionResult { kMet, kNotMet, kUnknown };

struct CatalogMatch {
  const CatalogEntry* entry = nullptr;
  bool applies = false;                          // no condition is known to be unmet
  std::vector<std::string> met, unmet, unknown;  // condition texts
};

class Catalog {
 public:
  static Status load(const std::string& path, Catalog* out);
  static Status parse(const nlohmann::json& j, Catalog* out);

  const std::vector<CatalogEntry>& entries() const { return entries_; }
  std::vector<const CatalogEntry*> lookup(std::string_view op_name) const;
  const CatalogEntry* find(std::string_view id) const;
  // Case-insensitive search over id, op names, remedy and condition text.
  std::vector<const CatalogEntry*> search(std::string_view query) const;

 private:
  static Status parse_unchecked(const nlohmann::json& j, Catalog* out);
  std::vector<CatalogEntry> entries_;
  std::unordered_map<std::string, std::vector<size_t>> by_op_;
  std::vector<std::pair<std::string, size_t>> by_namespace_;  // "ns::", entry
};

ConditionResult check_condition(const CatalogCondition& c, const OpFacts& facts);
CatalogMatch evaluate(const CatalogEntry& entry, const OpFacts& facts);
// The first applicable entry for a chain given innermost first; nullopt when none applies.
std::optional<CatalogMatch> explain_chain(const Catalog& catalog,
                                          const std::vector<OpFacts>& innermost_first);

nlohmann::json entry_to_json(const CatalogEntry& e);

// Index into the flattened inputs of the start of positional argument `arg`, or -1.
int argument_value_index(const std::vector<trace::Value>& values, int arg);

}  // namespace detaudit
