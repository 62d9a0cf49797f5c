// Parses and validates the run configuration (docs/config.md). Every error names the field by
// its JSON path ("select.steps[1]") so a user can find it without reading the parser.
#include "config/config.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace detaudit {
namespace {

using nlohmann::json;

Status field_error(const std::string& field, const std::string& why) {
  return Status::error(fmt::format("field \"{}\": {}", field, why), ExitCode::kUsage);
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string type_name(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "a list";
  return "an object";
}

// Rejects keys outside `allowed`, naming the first unknown one.
Status check_object(const json& j, const std::string& field,
                    std::initializer_list<const char*> allowed) {
  if (!j.is_object())
    return field_error(field.empty() ? "<top level>" : field,
                       fmt::format("expected an object, got {}", type_name(j)));
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* a : allowed) known = known || it.key() == a;
    if (!known) {
      std::string names;
      for (const char* a : allowed) names += std::string(names.empty() ? "" : ", ") + a;
      return field_error(join_path(field, it.key()),
                         fmt::format("unknown field (expected one of: {})", names));
    }
  }
  return Status();
}

Status get_string(const json& j, const std::string& field, std::string* out) {
  if (!j.is_string()) return field_error(field, "expected a string, got " + type_name(j));
  *out = j.get<std::string>();
  return Status();
}

Status get_bool(const json& j, const std::string& field, bool* out) {
  if (!j.is_boolean()) return field_error(field, "expected true or false, got " + type_name(j));
  *out = j.get<bool>();
  return Status();
}

Status get_int(const json& j, const std::string& field, int64_t min, int64_t max, int64_t* out) {
  if (!j.is_number_integer()) return field_error(field, "expected an integer, got " + type_name(j));
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return field_error(field, fmt::format("expected an integer from {} to {}", min, max));
  int64_t v = j.get<int64_t>();
  if (v < min || v > max)
    return field_error(field,
                       fmt::format("expected an integer from {} to {}, got {}", min, max, v));
  *out = v;
  return Status();
}

Status get_number(const json& j, const std::string& field, double* out) {
  if (!j.is_number()) return field_error(field, "expected a number, got " + type_name(j));
  *out = j.get<double>();
  if (!(*out >= 0)) return field_error(field, "expected a non-negative number");
  return Status();
}

Status get_choice(const json& j, const std::string& field,
                  std::initializer_list<const char*> choices, std::string* out) {
  std::string names;
  for (const char* c : choices) names += std::string(names.empty() ? "" : ", ") + "\"" + c + "\"";
  if (!j.is_string())
    return field_error(field, "expected one of " + names + ", got " + type_name(j));
  std::string v = j.get<std::string>();
  for (const char* c : choices)
    if (v == c) {
      *out = v;
      return Status();
    }
  return field_error(field, fmt::format("expected one of {}, got \"{}\"", names, v));
}

Status get_string_list(const json& j, const std::string& field, std::vector<std::string>* out) {
  if (!j.is_array()) return field_error(field, "expected a list of strings, got " + type_name(j));
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    std::string s;
    if (Status st = get_string(j[i], fmt::format("{}[{}]", field, i), &s); !st.ok()) return st;
    out->push_back(std::move(s));
  }
  return Status();
}

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

Status parse_target(const json& j, TargetConfig* t) {
  if (Status s = check_object(j, "target", {"command", "env", "cwd"}); !s.ok()) return s;
  if (j.contains("command")) {
    if (Status s = get_string_list(j["command"], "target.command", &t->command); !s.ok()) return s;
    // An empty list means "not set here": `run` then takes the program from after "--".
    if (!t->command.empty() && t->command[0].empty())
      return field_error("target.command[0]", "the program is empty");
  }
  if (j.contains("env")) {
    const json& env = j["env"];
    if (!env.is_object())
      return field_error("target.env", "expected an object of strings, got " + type_name(env));
    t->env.clear();
    for (auto it = env.begin(); it != env.end(); ++it) {
      std::string field = "target.env." + it.key();
      if (it.key().empty() || it.key().find('=') != std::string::npos)
        return field_error(field, "a variable name must be non-empty and have no '='");
      std::string v;
      if (Status s = get_string(it.value(), field, &v); !s.ok()) return s;
      t->env[it.key()] = v;
    }
  }
  if (j.contains("cwd"))
    if (Status s = get_string(j["cwd"], "target.cwd", &t->cwd); !s.ok()) return s;
  return Status();
}

Status parse_phases(const json& j, std::vector<trace::Phase>* out) {
  const std::string field = "select.phases";
  if (j.is_string() && j.get<std::string>() == "all") {
    out->clear();
    return Status();
  }
  if (!j.is_array())
    return field_error(field, "expected a list of phases or \"all\", got " + type_name(j));
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    std::string name;
    if (Status s = get_choice(j[i], fmt::format("{}[{}]", field, i),
                              {"forward", "backward", "optimizer", "other"}, &name);
        !s.ok())
      return s;
    for (trace::Phase p : {trace::Phase::kForward, trace::Phase::kBackward,
                           trace::Phase::kOptimizer, trace::Phase::kOther})
      if (trace::phase_name(p) == name) out->push_back(p);
  }
  if (out->empty()) return field_error(field, "expected at least one phase (or \"all\")");
  return Status();
}

Status parse_select(const json& j, SelectConfig* sel) {
  if (Status s = check_object(j, "select", {"steps", "ops", "phases", "ranks"}); !s.ok()) return s;
  if (j.contains("steps"))
    if (Status s = RangeSet::parse(j["steps"], "select.steps", &sel->steps); !s.ok()) return s;
  if (j.contains("ranks"))
    if (Status s = RangeSet::parse(j["ranks"], "select.ranks", &sel->ranks); !s.ok()) return s;
  if (j.contains("phases"))
    if (Status s = parse_phases(j["phases"], &sel->phases); !s.ok()) return s;
  if (j.contains("ops")) {
    const json& ops = j["ops"];
    if (Status s = check_object(ops, "select.ops", {"include", "exclude"}); !s.ok()) return s;
    if (ops.contains("include"))
      if (Status s = get_string_list(ops["include"], "select.ops.include", &sel->include_ops);
          !s.ok())
        return s;
    if (ops.contains("exclude"))
      if (Status s = get_string_list(ops["exclude"], "select.ops.exclude", &sel->exclude_ops);
          !s.ok())
        return s;
  }
  return Status();
}

Status parse_determinism(const json& j, DeterminismConfig* d) {
  if (Status s = check_object(j, "determinism",
                              {"seed", "algorithms", "intra_op_threads", "mkl_vml_warm_up"});
      !s.ok())
    return s;
  if (j.contains("seed")) {
    const json& seed = j["seed"];
    if (seed.is_null()) {
      d->seed.reset();
    } else if (seed.is_number_unsigned()) {
      d->seed = seed.get<uint64_t>();
    } else {
      return field_error(
          "determinism.seed",
          "expected a non-negative integer (or null), got " +
              (seed.is_number_integer() ? std::to_string(seed.get<int64_t>()) : type_name(seed)));
    }
  }
  if (j.contains("algorithms")) {
    if (j["algorithms"].is_null()) {
      d->algorithms.clear();
    } else if (Status s = get_choice(j["algorithms"], "determinism.algorithms",
                                     {"on", "warn", "off"}, &d->algorithms);
               !s.ok()) {
      return s;
    }
  }
  if (j.contains("intra_op_threads")) {
    if (j["intra_op_threads"].is_null()) {
      d->intra_op_threads.reset();
    } else {
      int64_t n = 0;
      if (Status s = get_int(j["intra_op_threads"], "determinism.intra_op_threads", 1, 4096, &n);
          !s.ok())
        return s;
      d->intra_op_threads = int(n);
    }
  }
  if (j.contains("mkl_vml_warm_up"))
    if (Status s = get_bool(j["mkl_vml_warm_up"], "determinism.mkl_vml_warm_up",
                            &d->mkl_vml_warm_up);
        !s.ok())
      return s;
  return Status();
}

}  // namespace

Status RangeSet::parse(const json& j, const std::string& field, RangeSet* out) {
  const char* expected = "expected an integer or a range like \"0-3\"";
  out->ranges_.clear();
  if (j.is_string() && j.get<std::string>() == "all") return Status();
  json list = j;
  if (!j.is_array()) {
    if (!j.is_number_integer() && !j.is_string())
      return field_error(field, fmt::format("expected \"all\", or a list of integers and ranges "
                                            "like [0, \"2-4\", \"7-\"], got {}",
                                            type_name(j)));
    list = json::array({j});
  }
  if (list.empty())
    return field_error(field, "expected at least one integer or range (use \"all\" for every one)");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    std::string item = j.is_array() ? fmt::format("{}[{}]", field, i) : field;
    // A non-negative integer built in code is signed JSON; one parsed from text, unsigned.
    if (e.is_number_unsigned() || (e.is_number_integer() && e.get<int64_t>() >= 0)) {
      uint64_t v = e.get<uint64_t>();
      out->ranges_.emplace_back(v, v);
    } else if (e.is_string()) {
      std::string s = e.get<std::string>();
      if (s == "all") {
        out->ranges_.clear();
        return Status();
      }
      size_t dash = s.find('-');
      uint64_t lo = 0, hi = 0;
      if (dash == std::string::npos) {
        if (!parse_u64(s, &lo))
          return field_error(item, fmt::format("{}, got \"{}\"", expected, s));
        hi = lo;
      } else {
        if (!parse_u64(std::string_view(s).substr(0, dash), &lo))
          return field_error(item, fmt::format("{}, got \"{}\"", expected, s));
        std::string_view rest = std::string_view(s).substr(dash + 1);
        if (rest.empty()) {
          hi = std::numeric_limits<uint64_t>::max();
        } else if (!parse_u64(rest, &hi)) {
          return field_error(item, fmt::format("{}, got \"{}\"", expected, s));
        } else if (hi < lo) {
          return field_error(item, fmt::format("range \"{}\" ends before it starts", s));
        }
      }
      out->ranges_.emplace_back(lo, hi);
    } else if (e.is_number_integer()) {
      return field_error(item, fmt::format("{}, got {} (negative)", expected, e.get<int64_t>()));
    } else {
      return field_error(item, fmt::format("{}, got {}", expected, type_name(e)));
    }
  }
  return Status();
}

bool RangeSet::contains(uint64_t v) const {
  if (ranges_.empty()) return true;
  for (const auto& [lo, hi] : ranges_)
    if (v >= lo && v <= hi) return true;
  return false;
}

uint64_t RangeSet::max_bound() const {
  if (ranges_.empty()) return std::numeric_limits<uint64_t>::max();
  uint64_t m = 0;
  for (const auto& r : ranges_) m = std::max(m, r.second);
  return m;
}

json RangeSet::to_json() const {
  if (ranges_.empty()) return "all";
  json out = json::array();
  for (const auto& [lo, hi] : ranges_) {
    if (lo == hi)
      out.push_back(lo);
    else if (hi == std::numeric_limits<uint64_t>::max())
      out.push_back(fmt::format("{}-", lo));
    else
      out.push_back(fmt::format("{}-{}", lo, hi));
  }
  return out;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative matcher with one backtrack point: linear enough for op names.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool SelectConfig::wants_phase(trace::Phase p) const {
  if (phases.empty()) return true;
  for (trace::Phase q : phases)
    if (q == p) return true;
  return false;
}

bool SelectConfig::wants_op(std::string_view name) const {
  for (const auto& g : exclude_ops)
    if (glob_match(g, name)) return false;
  if (include_ops.empty()) return true;
  for (const auto& g : include_ops)
    if (glob_match(g, name)) return true;
  return false;
}

Status parse_config(const json& j, Config* out) {
  Config c = *out;  // fields absent from the JSON keep their current values
  if (Status s = check_object(
          j, "",
          {"target", "runs", "out", "select", "digest", "record", "determinism", "gate", "report"});
      !s.ok())
    return s;
  if (j.contains("target"))
    if (Status s = parse_target(j["target"], &c.target); !s.ok()) return s;
  if (j.contains("runs")) {
    int64_t runs = 0;
    if (Status s = get_int(j["runs"], "runs", 1, 1000, &runs); !s.ok()) return s;
    c.runs = int(runs);
  }
  if (j.contains("out")) {
    if (Status s = get_string(j["out"], "out", &c.out); !s.ok()) return s;
    if (c.out.empty()) return field_error("out", "expected a directory path, got \"\"");
  }
  if (j.contains("select"))
    if (Status s = parse_select(j["select"], &c.select); !s.ok()) return s;
  if (j.contains("digest")) {
    std::string name;
    if (Status s = get_choice(j["digest"], "digest", {"md5", "sha256", "xxh3", "device"}, &name);
        !s.ok())
      return s;
    trace::parse_digest_name(name, &c.digest);
    c.digest_chosen = true;
  }
  if (j.contains("record")) {
    const json& r = j["record"];
    if (Status s = check_object(r, "record",
                                {"stats", "inputs", "rehash_inputs", "device_batch_mib",
                                 "compiled_kernels", "sentinel", "full_steps", "warn_after_steps"});
        !s.ok())
      return s;
    if (r.contains("device_batch_mib"))
      if (Status s = get_int(r["device_batch_mib"], "record.device_batch_mib", 0, 1 << 20,
                             &c.device_batch_mib);
          !s.ok())
        return s;
    if (r.contains("warn_after_steps"))
      if (Status s = get_int(r["warn_after_steps"], "record.warn_after_steps", 0, int64_t(1) << 40,
                             &c.warn_after_steps);
          !s.ok())
        return s;
    if (r.contains("stats"))
      if (Status s = get_bool(r["stats"], "record.stats", &c.stats); !s.ok()) return s;
    if (r.contains("compiled_kernels"))
      if (Status s = get_bool(r["compiled_kernels"], "record.compiled_kernels",
                              &c.compiled_kernels);
          !s.ok())
        return s;
    if (r.contains("rehash_inputs"))
      if (Status s = get_bool(r["rehash_inputs"], "record.rehash_inputs", &c.rehash_inputs);
          !s.ok())
        return s;
    if (r.contains("inputs"))
      if (Status s = get_bool(r["inputs"], "record.inputs", &c.inputs); !s.ok()) return s;
    if (r.contains("sentinel"))
      if (Status s = get_bool(r["sentinel"], "record.sentinel", &c.sentinel); !s.ok()) return s;
    if (r.contains("full_steps") && !r["full_steps"].is_null()) {
      RangeSet steps;
      if (Status s = RangeSet::parse(r["full_steps"], "record.full_steps", &steps); !s.ok())
        return s;
      c.full_steps = steps;
    }
  }
  if (j.contains("determinism"))
    if (Status s = parse_determinism(j["determinism"], &c.determinism); !s.ok()) return s;
  if (j.contains("gate")) {
    const json& g = j["gate"];
    if (Status s = check_object(g, "gate", {"fail_on", "rtol", "atol", "ulp", "allow_truncated"});
        !s.ok())
      return s;
    if (g.contains("allow_truncated"))
      if (Status s = get_bool(g["allow_truncated"], "gate.allow_truncated",
                              &c.gate.allow_truncated);
          !s.ok())
        return s;
    if (g.contains("fail_on"))
      if (Status s = get_choice(g["fail_on"], "gate.fail_on", {"any", "tolerance", "training"},
                                &c.gate.fail_on);
          !s.ok())
        return s;
    if (g.contains("rtol"))
      if (Status s = get_number(g["rtol"], "gate.rtol", &c.gate.rtol); !s.ok()) return s;
    if (g.contains("atol"))
      if (Status s = get_number(g["atol"], "gate.atol", &c.gate.atol); !s.ok()) return s;
    if (g.contains("ulp"))
      if (Status s = get_number(g["ulp"], "gate.ulp", &c.gate.ulp); !s.ok()) return s;
  }
  if (j.contains("report")) {
    const json& r = j["report"];
    if (Status s = check_object(r, "report", {"format", "output"}); !s.ok()) return s;
    if (r.contains("format"))
      if (Status s = get_choice(r["format"], "report.format",
                                {"text", "json", "junit", "markdown", "html"}, &c.format);
          !s.ok())
        return s;
    if (r.contains("output"))
      if (Status s = get_string(r["output"], "report.output", &c.output); !s.ok()) return s;
  }
  *out = std::move(c);
  return Status();
}

Status load_config(const std::string& path, Config* out) {
  std::ifstream in(path);
  if (!in)
    return Status::error(fmt::format("{}: cannot read config: {}", path, std::strerror(errno)),
                         ExitCode::kUsage);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) {
    // Parse again with exceptions on only to learn where it failed.
    std::ifstream again(path);
    std::string why = "not valid JSON";
    try {
      json ignored = json::parse(again, nullptr, true, true);
    } catch (const json::parse_error& e) {
      why = fmt::format("not valid JSON (at byte {})", e.byte);
    } catch (const json::exception& e) {
      // A number beyond double's range (1e999) is an out_of_range error, not a parse_error.
      why = fmt::format("not valid JSON ({})", e.what());
    }
    return Status::error(fmt::format("{}: {}", path, why), ExitCode::kUsage);
  }
  Status s = parse_config(j, out);
  if (!s.ok()) return Status::error(fmt::format("{}: {}", path, s.message()), s.code());
  return Status();
}

json config_to_json(const Config& c) {
  json j;
  j["target"] = {{"command", c.target.command}, {"env", c.target.env}, {"cwd", c.target.cwd}};
  j["runs"] = c.runs;
  j["out"] = c.out;
  json phases = json::array();
  for (trace::Phase p : c.select.phases) phases.push_back(std::string(trace::phase_name(p)));
  j["select"] = {{"steps", c.select.steps.to_json()},
                 {"ops", {{"include", c.select.include_ops}, {"exclude", c.select.exclude_ops}}},
                 {"phases", c.select.phases.empty() ? json("all") : phases},
                 {"ranks", c.select.ranks.to_json()}};
  j["digest"] = std::string(trace::digest_name(c.digest));
  j["record"] = {{"stats", c.stats},
                 {"inputs", c.inputs},
                 {"rehash_inputs", c.rehash_inputs},
                 {"device_batch_mib", c.device_batch_mib},
                 {"compiled_kernels", c.compiled_kernels},
                 {"sentinel", c.sentinel},
                 {"full_steps", c.full_steps ? c.full_steps->to_json() : json(nullptr)},
                 {"warn_after_steps", c.warn_after_steps}};
  json det;
  det["seed"] = c.determinism.seed ? json(*c.determinism.seed) : json(nullptr);
  det["algorithms"] = c.determinism.algorithms.empty() ? json(nullptr)
                                                       : json(c.determinism.algorithms);
  det["intra_op_threads"] = c.determinism.intra_op_threads ? json(*c.determinism.intra_op_threads)
                                                           : json(nullptr);
  det["mkl_vml_warm_up"] = c.determinism.mkl_vml_warm_up;
  j["determinism"] = det;
  j["gate"] = {{"fail_on", c.gate.fail_on},
               {"rtol", c.gate.rtol},
               {"atol", c.gate.atol},
               {"ulp", c.gate.ulp},
               {"allow_truncated", c.gate.allow_truncated}};
  j["report"] = {{"format", c.format}, {"output", c.output}};
  return j;
}

}  // namespace detaudit
