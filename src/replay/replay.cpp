#include "replay/replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "report/render.h"
#include "run_layout.h"
#include "trace/reader.h"

namespace detaudit::replay {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string series_result(const ReplaySeries& s) {
  if (!s.error.empty()) return "the op refused: " + s.error;
  return fmt::format("{} distinct output{}{}", s.distinct, s.distinct == 1 ? "" : "s",
                     s.distinct > 1 ? fmt::format(" (max |diff| {:.3g})", s.max_abs_diff) : "");
}

std::string plural(int n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

}  // namespace

// The process's intra-op threads and determinism flag, from its environment fingerprint.
void read_fingerprint(const std::string& run_dir, ReplayTarget* t) {
  std::ifstream in(fs::path(run_dir) / layout::kStreamsDir / (t->process + layout::kEnvExt));
  if (!in) return;
  try {
    json e = json::parse(in);
    if (e.contains("intra_op_threads") && e["intra_op_threads"].is_number_integer())
      t->intra_op_threads = e["intra_op_threads"].get<int>();
    if (e.contains("determinism") && e["determinism"].contains("deterministic_algorithms"))
      t->deterministic = e["determinism"]["deterministic_algorithms"].get<bool>();
  } catch (const std::exception&) {
    // An unreadable fingerprint: replay with the replayer's defaults, said in the report.
  }
}

Status parse_op_ref(const std::string& text, std::string* stream, uint64_t* index) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return Status::error(
        fmt::format("--op: expected STREAM:N (r0.main.t-main:51), got '{}'", text));
  *stream = text.substr(0, colon);
  try {
    size_t used = 0;
    *index = std::stoull(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    return Status::error(fmt::format("--op: '{}' is not an op number", text.substr(colon + 1)));
  }
  return Status();
}

Status find_replay_target(const std::string& run_dir, const std::string& stream, uint64_t index,
                          ReplayTarget* out) {
  *out = ReplayTarget{};
  const fs::path path = fs::path(run_dir) / layout::kStreamsDir / (stream + layout::kTraceExt);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::error(fmt::format("{}: no stream {} (the streams are the files in {}/)", run_dir,
                                     stream, (fs::path(run_dir) / layout::kStreamsDir).string()));
  trace::TraceReader r;
  if (Status s = r.open(path.string()); !s.ok())
    return Status::error(s.message(), ExitCode::kBadInput);
  out->run_dir = run_dir;
  out->stream = stream;
  out->index = index;
  out->process = stream.substr(0, stream.find(".t-"));
  out->thread = stream.substr(std::min(stream.size(), out->process.size() + 3));
  // A name claimed twice ("main~1") is counted by its thread's own name.
  out->thread = out->thread.substr(0, out->thread.find('~'));
  out->digest = std::string(trace::digest_name(r.header().algo));
  // Records come in end order; the interposer counts in start order, which `order` gives.
  std::vector<uint64_t> orders_same_name;
  uint64_t i = 0, target_order = 0;
  bool found = false;
  trace::ReadResult res;
  while ((res = r.next()) == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (i == index) {
      found = true;
      out->op = std::string(r.string(op.name));
      out->step = op.step;
      out->phase = std::string(trace::phase_name(op.phase));
      target_order = op.order;
      for (int64_t id : op.input_tensors) out->inputs.push_back(trace::contents_hex(r.tensor(id)));
      for (int64_t id : op.output_tensors)
        out->recorded_outputs.push_back(trace::contents_hex(r.tensor(id)));
    }
    orders_same_name.push_back(op.order);  // names checked below, once the target's is known
    ++i;
  }
  if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
  if (!found)
    return Status::error(fmt::format("{}: stream {} has {} ops (0 to {}); there is no op {}",
                                     run_dir, stream, i, i ? i - 1 : 0, index));
  // Second pass: the occurrence among ops of the target's name, by start order.
  trace::TraceReader again;
  if (Status s = again.open(path.string()); !s.ok())
    return Status::error(s.message(), ExitCode::kBadInput);
  uint64_t before = 0;
  while (again.next() == trace::ReadResult::kRecord)
    if (again.kind() == trace::RecordKind::kOp && again.string(again.op().name) == out->op &&
        again.op().order < target_order)
      ++before;
  out->occurrence = before;
  read_fingerprint(run_dir, out);
  return Status();
}

json capture_spec_json(const ReplayTarget& t, const std::string& dir) {
  return {{"process", t.process},       {"thread", t.thread}, {"op", t.op},
          {"occurrence", t.occurrence}, {"inputs", t.inputs}, {"dir", dir}};
}

void read_capture(const std::string& dir, ReplayReport* r) {
  std::ifstream in(fs::path(dir) / "capture.json");
  if (!in) {
    r->capture_status = "not-reached";
    r->capture_why = fmt::format(
        "the new run never reached {} #{} of {}: the program took another path, or ended first",
        r->target.op, r->target.occurrence, r->target.stream);
    return;
  }
  try {
    json j = json::parse(in);
    r->capture_status = j.value("status", "error");
    r->capture_why = j.value("why", "");
    r->inputs_file = j.value("inputs_file", "");
    if (j.contains("differing_inputs"))
      for (const json& d : j["differing_inputs"])
        r->capture_why += fmt::format("; input {} is {} (recorded {})", d["input"].get<int>(),
                                      d["now"].get<std::string>(),
                                      d["recorded"].get<std::string>());
    if (j.contains("compacted"))
      for (const json& a : j["compacted"])
        r->capture_why += fmt::format(
            "{}argument {} saved compact (its storage is over 1 GiB): a kernel that chooses by "
            "layout may take another path in replay",
            r->capture_why.empty() ? "" : "; ", a.get<int>());
  } catch (const std::exception& e) {
    r->capture_status = "error";
    r->capture_why = fmt::format("{}/capture.json: {}", dir, e.what());
  }
}

bool capture_may_succeed_again(const ReplayReport& r) {
  return r.capture_status == "other-path" || r.capture_status == "not-reached";
}

Status add_series(const std::string& setting, const json& j, ReplayReport* r) {
  ReplaySeries s;
  s.setting = setting;
  try {
    s.replays = j.at("replays").get<int>();
    s.threads = j.at("threads").get<int>();
    s.deterministic = j.at("deterministic").get<bool>();
    s.busy_thread = j.at("busy_thread").get<bool>();
    s.distinct = j.at("distinct").get<int>();
    s.max_abs_diff = j.at("max_abs_diff").get<double>();
    s.cores_used = j.value("cores_used", 0.0);
    s.error = j.value("error", "");
    for (const json& outs : j.at("outputs"))
      if (outs.get<std::vector<std::string>>() == r->target.recorded_outputs) ++s.matching_recorded;
    if (r->series.empty()) {
      const auto inputs = j.at("input_digests").get<std::vector<std::string>>();
      bool match = inputs.size() == r->target.inputs.size();
      for (size_t i = 0; match && i < inputs.size(); ++i)
        match = r->target.inputs[i].empty() || inputs[i] == r->target.inputs[i];
      r->inputs_match = match;
    }
  } catch (const std::exception& e) {
    return Status::error(
        fmt::format("the replayer's output is not what detaudit expects: {}", e.what()),
        ExitCode::kBadInput);
  }
  r->series.push_back(std::move(s));
  return Status();
}

void judge(ReplayReport* r) {
  if (r->capture_status != "saved") {
    r->evidence = "unverified";
    r->evidence_line = fmt::format(
        "unverified: the op's inputs were not captured ({}{}): {}", r->capture_status,
        r->capture_runs > 1 ? fmt::format(" in {} new runs", r->capture_runs) : "", r->capture_why);
    return;
  }
  if (!r->inputs_match) {
    r->evidence = "unverified";
    r->evidence_line = "unverified: the saved inputs do not hash to the record's digests";
    return;
  }
  const ReplaySeries* reproduced = nullptr;
  int total = 0;
  for (const ReplaySeries& s : r->series) {
    if (s.setting == "under the remedy") continue;
    total += s.replays;
    if (s.error.empty() && s.distinct > 1 && !reproduced)
      reproduced = &s;  // the first setting that shows it
  }
  if (reproduced) {
    r->evidence = "verified-nondeterministic";
    r->evidence_line = fmt::format(
        "reproduced: {} in {} replays {} (max |diff| {:.3g}) on the recorded inputs",
        plural(reproduced->distinct, "distinct output", "distinct outputs"), reproduced->replays,
        reproduced->setting, reproduced->max_abs_diff);
  } else if (!r->series.empty() && r->series.front().error.empty()) {
    r->evidence = "not-reproduced";
    r->evidence_line = fmt::format(
        "not reproduced in isolation: {} replays on the recorded inputs gave one output. The "
        "difference may need what a replay does not carry: a first-call race (oneMKL VML's), "
        "memory layout, or state from earlier ops",
        total);
  } else {
    r->evidence = "unverified";
    r->evidence_line = fmt::format("unverified: the op failed on replay: {}",
                                   r->series.empty() ? "no replay ran" : r->series.front().error);
  }
  for (const ReplaySeries& s : r->series) {
    if (s.setting != "under the remedy") continue;
    const std::string setting = fmt::format(
        "use_deterministic_algorithms({}), {}", s.deterministic ? "True" : "False",
        plural(s.threads, "intra-op thread", "intra-op threads"));
    if (!s.error.empty())
      r->remedy_line = fmt::format("remedy not verified: under {} the op refused: {}", setting,
                                   s.error);
    else if (s.distinct == 1)
      r->remedy_line = fmt::format("remedy verified in isolation: {} of {} identical ({})",
                                   s.replays, s.replays, setting);
    else
      r->remedy_line = fmt::format("remedy NOT verified: {} in {} replays under {}",
                                   plural(s.distinct, "distinct output", "distinct outputs"),
                                   s.replays, setting);
  }
}

json report_to_json(const ReplayReport& r) {
  const ReplayTarget& t = r.target;
  json series = json::array();
  for (const ReplaySeries& s : r.series)
    series.push_back({{"setting", s.setting},
                      {"replays", s.replays},
                      {"threads", s.threads},
                      {"deterministic", s.deterministic},
                      {"busy_thread", s.busy_thread},
                      {"distinct", s.distinct},
                      {"max_abs_diff", s.max_abs_diff},
                      {"cores_used", s.cores_used},
                      {"matching_recorded", s.matching_recorded},
                      {"error", s.error.empty() ? json(nullptr) : json(s.error)}});
  return {{"schema", "detaudit.replay/1"},
          {"op",
           {{"run", t.run_dir},
            {"stream", t.stream},
            {"index", t.index},
            {"name", t.op},
            {"occurrence", t.occurrence},
            {"step", t.step},
            {"phase", t.phase}}},
          {"capture",
           {{"status", r.capture_status},
            {"why", r.capture_why.empty() ? json(nullptr) : json(r.capture_why)},
            {"inputs_file", r.inputs_file.empty() ? json(nullptr) : json(r.inputs_file)},
            {"inputs_match", r.inputs_match},
            {"runs", r.capture_runs},
            {"digest", t.digest}}},
          {"series", series},
          {"evidence", r.evidence},
          {"evidence_line", r.evidence_line},
          {"remedy_line", r.remedy_line.empty() ? json(nullptr) : json(r.remedy_line)}};
}

std::string render_text(const ReplayReport& r) {
  const ReplayTarget& t = r.target;
  std::string out = fmt::format("REPLAY {} #{} {} (step {}, {} phase) of {}\n", t.stream, t.index,
                                t.op, t.step, t.phase, t.run_dir);
  if (r.capture_status == "saved")
    out += fmt::format(
        "  inputs captured from a new run{}: {}{}\n",
        r.capture_runs > 1 ? fmt::format(" (run {}: {} took another path)", r.capture_runs,
                                         r.capture_runs == 2 ? "the first" : "the ones before")
                           : "",
        r.inputs_file, r.inputs_match ? ", digests as recorded" : ", digests NOT as recorded");
  if (r.capture_status == "saved" && !r.capture_why.empty())
    out += fmt::format("  note: {}\n", r.capture_why);
  for (const ReplaySeries& s : r.series) {
    out += fmt::format("  {:<17} {:>3} replays, {}, deterministic {}{}: ", s.setting, s.replays,
                       plural(s.threads, "thread", "threads"), s.deterministic ? "on" : "off",
                       s.busy_thread ? ", a busy thread" : "");
    if (!s.error.empty())
      out += fmt::format("the op refused: {}\n", s.error);
    else
      out += fmt::format("{}{}\n", plural(s.distinct, "distinct output", "distinct outputs"),
                         s.distinct > 1 ? fmt::format(" (max |diff| {:.3g})", s.max_abs_diff) : "");
  }
  out += fmt::format("  evidence: {}\n", r.evidence_line);
  if (!r.remedy_line.empty()) out += fmt::format("  {}\n", r.remedy_line);
  return out;
}

std::string render_markdown(const ReplayReport& r) {
  const ReplayTarget& t = r.target;
  std::string out = fmt::format(
      "## detaudit replay: {}\n\n`{}` #{} `{}` (step {}, {} phase) of `{}`\n\n", r.evidence,
      t.stream, t.index, t.op, t.step, t.phase, t.run_dir);
  if (!r.series.empty()) {
    out += "| setting | replays | threads | deterministic | result |\n|---|---:|---:|---|---|\n";
    for (const ReplaySeries& s : r.series) {
      std::string result;
      for (char c : series_result(s)) result += c == '|' ? std::string("\\|") : std::string(1, c);
      out += fmt::format("| {}{} | {} | {} | {} | {} |\n", s.setting,
                         s.busy_thread ? " (a busy thread)" : "", s.replays, s.threads,
                         s.deterministic ? "on" : "off", result);
    }
    out += "\n";
  }
  out += "**" + r.evidence_line + "**\n\n";
  if (!r.remedy_line.empty()) out += r.remedy_line + "\n";
  return out;
}

std::string render_junit(const ReplayReport& r) {
  const bool nondeterministic = r.evidence == "verified-nondeterministic";
  std::string cases = fmt::format(
      "  <testcase classname=\"detaudit.replay\" name=\"evidence\">{}<system-out>{}</system-out>"
      "</testcase>\n",
      nondeterministic ? fmt::format("<failure message=\"{}\"/>", escape_markup(r.evidence_line))
                       : "",
      escape_markup(render_text(r)));
  int failures = nondeterministic ? 1 : 0, tests = 1;
  if (!r.remedy_line.empty()) {
    ++tests;
    const bool verified = r.remedy_line.rfind("remedy verified", 0) == 0;
    if (!verified) ++failures;
    cases += fmt::format(
        "  <testcase classname=\"detaudit.replay\" name=\"remedy\">{}</testcase>\n",
        verified ? "<system-out>" + escape_markup(r.remedy_line) + "</system-out>"
                 : fmt::format("<failure message=\"{}\"/>", escape_markup(r.remedy_line)));
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"detaudit\" tests=\"{0}\" "
      "failures=\"{1}\">\n<testsuite name=\"detaudit replay {2}\" tests=\"{0}\" failures=\"{1}\" "
      "errors=\"0\">\n{3}</testsuite>\n</testsuites>\n",
      tests, failures, escape_markup(r.target.op), cases);
}

std::string render_html(const ReplayReport& r) {
  const ReplayTarget& t = r.target;
  std::string rows;
  for (const ReplaySeries& s : r.series)
    rows += fmt::format("<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                        escape_markup(s.setting), s.busy_thread ? " (a busy thread)" : "",
                        s.replays, s.threads, s.deterministic ? "on" : "off",
                        escape_markup(series_result(s)));
  return fmt::format(
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>detaudit replay: {0}</title>"
      "<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}"
      "td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}.e{{font-weight:bold}}</style>"
      "</head><body><h1>detaudit replay: {0}</h1><p><code>{1}</code> #{2} <code>{3}</code> (step "
      "{4}, {5} phase) of <code>{6}</code></p><p>capture: {7} (new runs: "
      "{12}){8}</p><table><tr><th>setting</th>"
      "<th>replays</th><th>threads</th><th>deterministic</th><th>result</th></tr>{9}</table>"
      "<p class=\"e\">{10}</p><p>{11}</p></body></html>\n",
      escape_markup(r.evidence), escape_markup(t.stream), t.index, escape_markup(t.op), t.step,
      escape_markup(t.phase), escape_markup(t.run_dir), escape_markup(r.capture_status),
      r.capture_why.empty() ? "" : ": " + escape_markup(r.capture_why), rows,
      escape_markup(r.evidence_line), escape_markup(r.remedy_line), r.capture_runs);
}

}  // namespace detaudit::replay
