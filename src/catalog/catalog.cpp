// Loads the catalog, looks entries up by recorded op name and checks their conditions.
#include "catalog/catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>

namespace detaudit {
namespace {

using nlohmann::json;

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

Status field_error(const std::string& where, const std::string& why) {
  return Status::error(fmt::format("catalog: {}: {}", where, why), ExitCode::kUsage);
}

Status read_strings(const json& j, const char* key, const std::string& where,
                    std::vector<std::string>* out) {
  if (!j.contains(key)) return Status();
  const json& v = j.at(key);
  if (v.is_string()) {
    out->push_back(v.get<std::string>());
    return Status();
  }
  if (!v.is_array()) return field_error(where + "." + key, "expected a string or a list");
  for (const json& e : v) {
    if (!e.is_string()) return field_error(where + "." + key, "expected strings");
    out->push_back(e.get<std::string>());
  }
  return Status();
}

// An integer from lo to hi. nlohmann's get<int>() of 1e300 is undefined behaviour and a
// negative count read as uint64_t wraps: neither may become an argument index or a threshold.
Status int_value(const json& v, const std::string& where, int64_t lo, int64_t hi, int64_t* out) {
  bool ok = v.is_number_integer() &&
            (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi)
                                    : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi);
  if (!ok) return field_error(where, fmt::format("expected an integer from {} to {}", lo, hi));
  *out = v.get<int64_t>();
  return Status();
}

// The same for an optional field; *out keeps its value when the field is absent.
Status read_int(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi,
                int64_t* out) {
  auto it = j.find(key);
  return it == j.end() ? Status() : int_value(*it, where + "." + key, lo, hi, out);
}

std::string str_or(const json& j, const char* key, const std::string& d = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : d;
}

Status parse_condition(const json& j, const std::string& where, CatalogCondition* c) {
  if (!j.is_object()) return field_error(where, "a condition is an object");
  int64_t arg = -1, min_numel = 0, min_threads = 0;
  Status s;
  if (!(s = read_int(j, "arg", where, -1, INT32_MAX, &arg)).ok() ||
      !(s = read_int(j, "min_numel", where, 0, INT64_MAX, &min_numel)).ok() ||
      !(s = read_int(j, "min_intra_op_threads", where, 0, INT64_MAX, &min_threads)).ok())
    return s;
  c->arg = int(arg);
  c->name = str_or(j, "name");
  if (j.contains("equals")) c->equals = j.at("equals");
  c->contains = str_or(j, "contains");
  if (j.contains("given")) c->given = j.at("given").get<bool>();
  c->dtype = str_or(j, "dtype");
  c->environment = str_or(j, "environment");
  c->min_numel = uint64_t(min_numel);
  c->min_intra_op_threads = uint64_t(min_threads);
  if (Status s = read_strings(j, "applies_to", where, &c->applies_to); !s.ok()) return s;
  if (!c->environment.empty() && (!c->equals || c->arg >= 0))
    return field_error(where, "an environment condition needs \"equals\" and no \"arg\"");
  int tests = int(c->equals.has_value()) + int(!c->contains.empty()) + int(c->given.has_value()) +
              int(!c->dtype.empty()) + int(c->min_numel > 0) + int(c->min_intra_op_threads > 0);
  if (tests != 1)
    return field_error(where,
                       "needs exactly one of equals, contains, given, dtype, min_numel, "
                       "min_intra_op_threads");
  if ((c->equals || !c->contains.empty() || c->given || c->min_numel) && c->arg < 0 &&
      c->environment.empty())
    return field_error(where, "an argument condition needs \"arg\" (positional index)");
  std::string who = c->arg >= 0
                        ? fmt::format("{} (input {})", c->name.empty() ? "arg" : c->name, c->arg)
                        : std::string();
  if (!c->environment.empty())
    c->text = fmt::format("fingerprint {} == {}", c->environment, c->equals->dump());
  else if (c->equals)
    c->text = fmt::format("{} == {}", who, c->equals->dump());
  else if (!c->contains.empty())
    c->text = fmt::format("{} contains \"{}\"", who, c->contains);
  else if (c->given)
    c->text = fmt::format("{} {}", who, *c->given ? "given" : "not given");
  else if (!c->dtype.empty())
    c->text = fmt::format("{}dtype {}", who.empty() ? "" : who + " ", c->dtype);
  else if (c->min_numel)
    c->text = fmt::format("{} numel >= {}", who, c->min_numel);
  else
    c->text = fmt::format("intra-op threads >= {}", c->min_intra_op_threads);
  return Status();
}

Status parse_entry(const json& j, size_t i, CatalogEntry* e) {
  std::string where = fmt::format("entries[{}]", i);
  if (!j.is_object()) return field_error(where, "an entry is an object");
  e->id = str_or(j, "id");
  if (e->id.empty()) return field_error(where, "missing \"id\"");
  where += " (" + e->id + ")";
  e->kind = str_or(j, "kind", "op");
  if (e->kind != "op" && e->kind != "environment")
    return field_error(where + ".kind", "expected \"op\" or \"environment\"");
  Status s;
  if (j.contains("rows"))
    for (const json& r : j.at("rows")) {
      int64_t row = 0;
      if (!(s = int_value(r, where + ".rows", 0, INT32_MAX, &row)).ok()) return s;
      e->rows.push_back(int(row));
    }
  if (!(s = read_strings(j, "ops", where, &e->ops)).ok()) return s;
  if (!(s = read_strings(j, "device", where, &e->devices)).ok()) return s;
  if (!(s = read_strings(j, "phase", where, &e->phases)).ok()) return s;
  if (!(s = read_strings(j, "env_keys", where, &e->env_keys)).ok()) return s;
  if (!(s = read_strings(j, "sources", where, &e->sources)).ok()) return s;
  if (e->kind == "op" && e->ops.empty()) return field_error(where, "an op entry needs \"ops\"");
  e->signature = str_or(j, "signature");
  e->condition = str_or(j, "condition");
  if (j.contains("conditions")) {
    const json& cs = j.at("conditions");
    for (size_t k = 0; k < cs.size(); ++k) {
      CatalogCondition c;
      if (!(s = parse_condition(cs[k], fmt::format("{}.conditions[{}]", where, k), &c)).ok())
        return s;
      e->conditions.push_back(std::move(c));
    }
  }
  if (j.contains("deterministic_alternative")) {
    const json& a = j.at("deterministic_alternative");
    e->deterministic_alternative = a.value("exists", false);
    e->alternative_since = str_or(a, "since");
    e->alternative = str_or(a, "how");
  }
  e->remedy = str_or(j, "remedy");
  if (e->remedy.empty()) return field_error(where, "missing \"remedy\"");
  if (e->sources.empty()) return field_error(where, "missing \"sources\"");
  if (!j.contains("uncertain") || !j.at("uncertain").is_boolean())
    return field_error(where, "missing boolean \"uncertain\"");
  e->uncertain = j.at("uncertain").get<bool>();
  e->uncertainty = str_or(j, "uncertainty");
  e->nondeterministic = j.value("nondeterministic", true);
  return Status();
}

// Skips one value (and, for a list, its elements) starting at values[i]; returns the next index.
size_t skip_value(const std::vector<trace::Value>& values, size_t i) {
  const trace::Value& v = values[i++];
  using trace::ValueType;
  if (v.type == ValueType::kList) {
    for (uint64_t k = 0; k < v.count && i < values.size(); ++k) i = skip_value(values, i);
  } else if (v.type == ValueType::kIntList || v.type == ValueType::kDoubleList ||
             v.type == ValueType::kBoolList) {
    i += size_t(v.count);
  }
  return i;
}

bool dtype_matches(const std::string& want, trace::Dtype dtype) {
  if (size_t bar = want.find('|'); bar != std::string::npos)  // "float32|float64": either
    return dtype_matches(want.substr(0, bar), dtype) || dtype_matches(want.substr(bar + 1), dtype);
  if (want == "floating") return trace::dtype_is_floating(dtype);
  if (want == "quantized")
    return trace::dtype_name(dtype).substr(0, 2) == "qu" ||
           trace::dtype_name(dtype).substr(0, 2) == "qi";
  return trace::dtype_name(dtype) == want;
}

const trace::TensorDesc* tensor_at(const OpFacts& f, const trace::Value& v) {
  if (!f.reader) return nullptr;
  if (!trace::is_tensor(v.type)) return nullptr;
  return f.reader->tensor(v.tensor_id);
}

bool is_autograd_node(std::string_view name) { return name.find("::") == std::string_view::npos; }

}  // namespace

int argument_value_index(const std::vector<trace::Value>& values, int arg) {
  size_t i = 0;
  for (int k = 0; k < arg; ++k) {
    if (i >= values.size()) return -1;
    i = skip_value(values, i);
  }
  return i < values.size() ? int(i) : -1;
}

Status Catalog::load(const std::string& path, Catalog* out) {
  std::ifstream in(path);
  if (!in) return Status::error(fmt::format("{}: cannot read the catalog", path), ExitCode::kUsage);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Status::error(fmt::format("{}: the catalog is not valid JSON", path), ExitCode::kUsage);
  Status s = parse(j, out);
  if (!s.ok()) return Status::error(path + ": " + s.message(), s.code());
  return s;
}

Status Catalog::parse(const json& j, Catalog* out) {
  // nlohmann throws on a wrongly typed field; keep that inside.
  try {
    return parse_unchecked(j, out);
  } catch (const json::exception& e) {
    return field_error("entries", e.what());
  }
}

Status Catalog::parse_unchecked(const json& j, Catalog* out) {
  if (!j.is_object() || !j.contains("entries") || !j.at("entries").is_array())
    return field_error("top level", "expected an object with an \"entries\" list");
  Catalog c;
  const json& es = j.at("entries");
  for (size_t i = 0; i < es.size(); ++i) {
    CatalogEntry e;
    if (Status s = parse_entry(es[i], i, &e); !s.ok()) return s;
    if (c.find(e.id)) return field_error(fmt::format("entries[{}]", i), "duplicate id " + e.id);
    c.entries_.push_back(std::move(e));
  }
  for (size_t i = 0; i < c.entries_.size(); ++i)
    for (const std::string& op : c.entries_[i].ops) {
      if (op.size() > 3 && op.compare(op.size() - 3, 3, "::*") == 0)
        c.by_namespace_.emplace_back(op.substr(0, op.size() - 1), i);
      else
        c.by_op_[op].push_back(i);
    }
  *out = std::move(c);
  return Status();
}

std::vector<const CatalogEntry*> Catalog::lookup(std::string_view op_name) const {
  std::vector<const CatalogEntry*> r;
  auto it = by_op_.find(std::string(op_name));
  if (it != by_op_.end())
    for (size_t i : it->second) r.push_back(&entries_[i]);
  for (const auto& [ns, i] : by_namespace_)
    if (op_name.substr(0, ns.size()) == ns) r.push_back(&entries_[i]);
  return r;
}

const CatalogEntry* Catalog::find(std::string_view id) const {
  for (const CatalogEntry& e : entries_)
    if (e.id == id) return &e;
  return nullptr;
}

std::vector<const CatalogEntry*> Catalog::search(std::string_view query) const {
  std::string q = lower(query);
  std::vector<const CatalogEntry*> r;
  for (const CatalogEntry& e : entries_) {
    std::string hay = e.id + "\n" + e.remedy + "\n" + e.condition + "\n" + e.signature;
    for (const std::string& op : e.ops) hay += "\n" + op;
    for (const std::string& k : e.env_keys) hay += "\n" + k;
    if (q.empty() || lower(hay).find(q) != std::string::npos) r.push_back(&e);
  }
  // Exact id or op name matches first.
  std::stable_partition(r.begin(), r.end(), [&](const CatalogEntry* e) {
    if (lower(e->id) == q) return true;
    for (const std::string& op : e->ops)
      if (lower(op) == q) return true;
    return false;
  });
  return r;
}

ConditionResult check_condition(const CatalogCondition& c, const OpFacts& f) {
  if (!c.environment.empty()) {
    if (!f.fingerprint) return ConditionResult::kUnknown;
    auto it = f.fingerprint->find(c.environment);
    if (it == f.fingerprint->end()) return ConditionResult::kUnknown;
    // Flattened values are a string's text or the JSON of anything else (environment.h).
    const std::string want = c.equals->is_string() ? c.equals->get<std::string>()
                                                   : c.equals->dump();
    return it->second == want ? ConditionResult::kMet : ConditionResult::kNotMet;
  }
  if (c.min_intra_op_threads) {
    if (f.intra_op_threads == 0) return ConditionResult::kUnknown;
    return f.intra_op_threads >= c.min_intra_op_threads ? ConditionResult::kMet
                                                        : ConditionResult::kNotMet;
  }
  if (!f.op) return ConditionResult::kUnknown;
  const auto& in = f.op->inputs;
  // A dtype condition without an argument looks at the first tensor input.
  if (c.arg < 0) {
    for (const trace::Value& v : in)
      if (const trace::TensorDesc* t = tensor_at(f, v))
        return dtype_matches(c.dtype, t->dtype) ? ConditionResult::kMet : ConditionResult::kNotMet;
    return ConditionResult::kUnknown;
  }
  int idx = argument_value_index(in, c.arg);
  if (idx < 0)
    return c.given ? (*c.given ? ConditionResult::kNotMet : ConditionResult::kMet)
                   : ConditionResult::kUnknown;
  const trace::Value& v = in[size_t(idx)];
  using trace::ValueType;
  if (c.given) {
    bool given = v.type != ValueType::kNone;
    return given == *c.given ? ConditionResult::kMet : ConditionResult::kNotMet;
  }
  if (c.equals) {
    const nlohmann::json& want = *c.equals;
    if (want.is_boolean()) {
      if (v.type != ValueType::kBoolTrue && v.type != ValueType::kBoolFalse)
        return ConditionResult::kUnknown;
      return (v.type == ValueType::kBoolTrue) == want.get<bool>() ? ConditionResult::kMet
                                                                  : ConditionResult::kNotMet;
    }
    if (want.is_number_integer()) {
      if (v.type != ValueType::kInt) return ConditionResult::kUnknown;
      return v.i == want.get<int64_t>() ? ConditionResult::kMet : ConditionResult::kNotMet;
    }
    if (want.is_string()) {
      if (v.type != ValueType::kString || !f.reader) return ConditionResult::kUnknown;
      return f.reader->string(uint64_t(v.i)) == want.get<std::string>() ? ConditionResult::kMet
                                                                        : ConditionResult::kNotMet;
    }
    return ConditionResult::kUnknown;
  }
  if (!c.contains.empty()) {
    if (v.type != ValueType::kString || !f.reader) return ConditionResult::kUnknown;
    return f.reader->string(uint64_t(v.i)).find(c.contains) != std::string_view::npos
               ? ConditionResult::kMet
               : ConditionResult::kNotMet;
  }
  // The recorder skips quantized tensors, saying why: that reason is their dtype's kind.
  if (v.type == ValueType::kTensorSkipped && c.dtype == "quantized" && f.reader)
    return f.reader->string(uint64_t(v.i)) == "quantized" ? ConditionResult::kMet
                                                          : ConditionResult::kUnknown;
  const trace::TensorDesc* t = tensor_at(f, v);
  if (!t) return ConditionResult::kUnknown;
  if (!c.dtype.empty())
    return dtype_matches(c.dtype, t->dtype) ? ConditionResult::kMet : ConditionResult::kNotMet;
  return t->numel() >= c.min_numel ? ConditionResult::kMet : ConditionResult::kNotMet;
}

CatalogMatch evaluate(const CatalogEntry& e, const OpFacts& f) {
  CatalogMatch m;
  m.entry = &e;
  bool autograd = is_autograd_node(f.name);
  // Device: of the first tensor the op touched.
  bool any_device = e.devices.empty() ||
                    std::find(e.devices.begin(), e.devices.end(), "any") != e.devices.end();
  if (!any_device && f.op && f.reader) {
    const trace::TensorDesc* t = nullptr;
    for (int64_t id : f.op->input_tensors)
      if ((t = f.reader->tensor(id))) break;
    if (!t)
      for (int64_t id : f.op->output_tensors)
        if ((t = f.reader->tensor(id))) break;
    if (t) {
      std::string dev(trace::device_type_name(t->device_type));
      std::string text = "device " + fmt::format("{}", fmt::join(e.devices, "|"));
      if (std::find(e.devices.begin(), e.devices.end(), dev) != e.devices.end())
        m.met.push_back(text);
      else
        m.unmet.push_back(text + " (ran on " + dev + ")");
    }
  }
  for (const CatalogCondition& c : e.conditions) {
    bool applies = c.applies_to.empty() ? (!autograd || c.arg < 0)
                                        : std::find(c.applies_to.begin(), c.applies_to.end(),
                                                    f.name) != c.applies_to.end();
    if (!applies) {
      m.unknown.push_back(c.text);
      continue;
    }
    switch (check_condition(c, f)) {
      case ConditionResult::kMet: m.met.push_back(c.text); break;
      case ConditionResult::kNotMet: m.unmet.push_back(c.text); break;
      case ConditionResult::kUnknown: m.unknown.push_back(c.text); break;
    }
  }
  m.applies = m.unmet.empty() && e.nondeterministic;
  return m;
}

std::optional<CatalogMatch> explain_chain(const Catalog& catalog,
                                          const std::vector<OpFacts>& innermost_first) {
  for (const OpFacts& f : innermost_first)
    for (const CatalogEntry* e : catalog.lookup(f.name)) {
      CatalogMatch m = evaluate(*e, f);
      if (m.applies) return m;
    }
  return std::nullopt;
}

nlohmann::json entry_to_json(const CatalogEntry& e) {
  json conds = json::array();
  for (const CatalogCondition& c : e.conditions) conds.push_back(c.text);
  return json{{"id", e.id},
              {"kind", e.kind},
              {"rows", e.rows},
              {"ops", e.ops},
              {"device", e.devices},
              {"phase", e.phases},
              {"signature", e.signature},
              {"condition", e.condition},
              {"conditions", conds},
              {"env_keys", e.env_keys},
              {"deterministic_alternative",
               {{"exists", e.deterministic_alternative},
                {"since", e.alternative_since},
                {"how", e.alternative}}},
              {"remedy", e.remedy},
              {"sources", e.sources},
              {"uncertain", e.uncertain},
              {"uncertainty", e.uncertainty},
              {"nondeterministic", e.nondeterministic}};
}

}  // namespace detaudit
