#include "run/validate.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "diff/diff.h"
#include "run/remedy.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A step no program reaches: the op path stays off, the marks callback alone runs.
constexpr uint64_t kNoStep = uint64_t(1) << 62;

std::vector<json> read_final_states(const std::string& dir) {
  std::map<int64_t, json> by_rank;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("final-state.r", 0) != 0 || e.path().extension() != ".json") continue;
    try {
      std::ifstream in(e.path());
      json j = json::parse(in);
      const int64_t rank = j.value("rank", int64_t(0));
      by_rank[rank] = std::move(j);
    } catch (const std::exception&) {
      // An unreadable state is no state: compared as missing.
    }
  }
  std::vector<json> out;
  for (auto& [rank, j] : by_rank) out.push_back(std::move(j));
  return out;
}

// Bypasses the gate's own verdict on the report: did the recorded runs pass?
bool recorded_passes(DiffReport r) {
  r.selftest.reset();
  r.validation.reset();
  return gate_exit_code(r) == ExitCode::kIdentical;
}

}  // namespace

void compare_final_states(const std::vector<json>& a, const std::vector<json>& b, Validation* v,
                          std::string* why) {
  v->compared = false;
  if (a.empty() || b.empty()) {
    *why = "a run left no final state (validate reads a Python program's torch.optim optimizers)";
    return;
  }
  if (a.size() != b.size()) {
    *why = fmt::format("the runs left the state of {} and {} ranks", a.size(), b.size());
    return;
  }
  v->identical = true;
  for (size_t r = 0; r < a.size(); ++r) {
    const json& ta = a[r]["tensors"];
    const json& tb = b[r]["tensors"];
    if (a[r].value("optimizers", 0) == 0 || ta.empty()) {
      *why = "the program had no torch.optim optimizer at exit";
      return;
    }
    const int64_t rank = a[r].value("rank", int64_t(0));
    for (size_t i = 0; i < std::max(ta.size(), tb.size()); ++i) {
      ++v->tensors;
      if (i < ta.size() && i < tb.size() && ta[i]["name"] == tb[i]["name"] &&
          ta[i]["sha256"] == tb[i]["sha256"])
        continue;
      if (v->identical)
        v->difference = fmt::format(
            "rank {} {}", rank, i < ta.size() ? ta[i].value("name", "") : tb[i].value("name", ""));
      v->identical = false;
    }
  }
  v->compared = true;
}

void judge_validation(const DiffReport& recorded, const std::string& why, Validation* v) {
  const bool passes = recorded_passes(recorded);
  if (!v->compared) {
    v->failed = true;
    v->outcome = "NOT VALIDATED: " + why;
  } else if (v->identical) {
    v->outcome = fmt::format("validated: the runs without recording leave the same {} tensors{}",
                             v->tensors,
                             passes ? "" : " (the recorded divergence does not reach them)");
  } else if (passes) {
    v->hidden = v->failed = true;
    v->outcome = fmt::format(
        "RECORDING HID THE DIVERGENCE: the runs without recording differ at {}, the recorded "
        "ones did not",
        v->difference);
  } else {
    v->outcome = fmt::format("validated: the runs without recording differ too, first at {}",
                             v->difference);
  }
}

Status validate_unrecorded(const Config& config, const RunOptions& options,
                           const DiffReport& recorded, const ValidateRunFn& on_run, Validation* v) {
  *v = Validation{};
  Config c = config;
  c.sentinel = false;
  c.select.steps = RangeSet();
  if (Status s = RangeSet::parse(json(fmt::format("{}", kNoStep)), "select.steps", &c.select.steps);
      !s.ok())
    return s;
  c.out = (fs::path(config.out) / "validate").string();
  v->runs = c.out;
  std::vector<std::vector<json>> states;
  for (int i = 0; i < 2; ++i) {
    const std::string state_dir =
        fs::absolute(fs::path(c.out) / fmt::format("state-{}", i)).string();
    std::error_code ec;
    fs::remove_all(state_dir, ec);
    fs::create_directories(state_dir, ec);
    Config ci = c;
    ci.target.env["DETAUDIT_FINAL_STATE"] = state_dir;
    fmt::print(stderr, "detaudit: validate: run {} of 2 with nothing recorded: {}/run-{}\n", i + 1,
               c.out, i);
    RunOutcome o;
    if (Status s = execute_run(ci, options, i, &o); !s.ok()) return s;
    if (on_run) on_run(o, i);
    states.push_back(read_final_states(state_dir));
  }
  std::string why;
  compare_final_states(states[0], states[1], v, &why);
  judge_validation(recorded, why, v);
  if (v->hidden) {
    // The cheapest observer: does it still see what full recording hid?
    Config s = config;
    s.sentinel = true;
    s.runs = 2;
    s.out = (fs::path(c.out) / "sentinel").string();
    bool recorded = false;
    DiffReport sentinel;
    if (Status st = record_and_diff_pair(s, options, nullptr, on_run, &recorded, &sentinel);
        !st.ok())
      return st;
    v->sentinel = !recorded
                      ? fmt::format("the sentinel's runs failed or recorded nothing ({})", s.out)
                  : sentinel.first
                      ? fmt::format("the sentinel shows it: first at {} step {} {} ({})",
                                    sentinel.first->stream, sentinel.first->step,
                                    sentinel.first->op, s.out)
                      : fmt::format("the sentinel hides it too: {} ({})",
                                    verdict_name(sentinel.verdict), s.out);
  }
  fmt::print(stderr, "detaudit: validate: {}\n", v->outcome);
  if (!v->sentinel.empty()) fmt::print(stderr, "detaudit: validate: {}\n", v->sentinel);
  return Status();
}

}  // namespace detaudit::run
