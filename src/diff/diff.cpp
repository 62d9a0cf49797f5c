// diff_runs: pairs the streams of two run directories, compares each, and merges the results
// into one report; plus the gate and the report format dispatch.
#include "diff/diff.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "diff/classify.h"
#include "diff/comparator.h"
#include "diff/environment.h"
#include "diff/report_model.h"
#include "report/render.h"
#include "run_layout.h"

namespace detaudit {
namespace fs = std::filesystem;

namespace {

Status list_streams(const std::string& run_dir, std::map<std::string, std::string>* out) {
  fs::path dir = fs::path(run_dir) / layout::kStreamsDir;
  std::error_code ec;
  if (!fs::exists(run_dir, ec))
    return Status::error(fmt::format("{}: no such run directory", run_dir), ExitCode::kBadInput);
  if (!fs::is_directory(run_dir, ec))
    return Status::error(fmt::format("{}: not a directory", run_dir), ExitCode::kBadInput);
  if (!fs::is_directory(dir, ec))
    return Status::error(fmt::format("{}: not a run directory (no {}/)", run_dir,
                                     layout::kStreamsDir),
                         ExitCode::kBadInput);
  std::string ext = layout::kTraceExt;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0)
      (*out)[name.substr(0, name.size() - ext.size())] = e.path().string();
  }
  if (ec) return Status::error(fmt::format("{}: {}", dir.string(), ec.message()),
                               ExitCode::kBadInput);
  if (out->empty()) {
    // Nothing to compare is not "identical": the interposer recorded nothing in this run.
    std::string why;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      std::string name = e.path().filename().string();
      std::string sext = layout::kStatusExt;
      if (name.size() <= sext.size() ||
          name.compare(name.size() - sext.size(), sext.size(), sext) != 0)
        continue;
      std::ifstream in(e.path());
      std::string line;
      std::getline(in, line);
      why = fmt::format(" ({}: {})", name, line);
      break;
    }
    return Status::error(fmt::format("{}: no trace stream in {}/ (nothing was recorded){}",
                                     run_dir, layout::kStreamsDir, why),
                         ExitCode::kBadInput);
  }
  return Status();
}

bool earlier(const FirstDivergence& x, const FirstDivergence& y) {
  if (x.step != y.step) return x.step < y.step;
  if (x.rank != y.rank) return x.rank < y.rank;
  if (x.process != y.process) return x.process < y.process;  // "r0.main" before its workers
  return x.order_a < y.order_a;
}

bool has_base_key(const std::vector<EnvDifference>& env, const EnvDifference& d) {
  std::string base = d.key.substr(0, d.key.find(' '));
  for (const EnvDifference& e : env)
    if (e.process == d.process && e.key == base) return true;
  return false;
}

}  // namespace

Status diff_runs(const std::string& run_a, const std::string& run_b, const DiffOptions& options,
                 DiffReport* report) {
  auto start = std::chrono::steady_clock::now();
  DiffReport r;
  r.run_a = run_a;
  r.run_b = run_b;
  r.gate = options.gate;
  std::map<std::string, std::string> sa, sb;
  if (Status s = list_streams(run_a, &sa); !s.ok()) return s;
  if (Status s = list_streams(run_b, &sb); !s.ok()) return s;
  std::map<std::string, std::map<std::string, std::string>> ea, eb;
  if (Status s = load_environment(run_a, &ea); !s.ok()) return s;
  if (Status s = load_environment(run_b, &eb); !s.ok()) return s;
  r.environment = diff_environment(ea, run_a, eb, run_b);

  std::map<std::string, bool> names;
  for (const auto& [n, _] : sa) names[n] = true;
  for (const auto& [n, _] : sb) names[n] = true;
  ProgressFn progress;
  if (options.progress)
    progress = [](const std::string& stream, uint64_t done, uint64_t total) {
      fmt::print(stderr, "detaudit diff: {}: {:.0f}% ({} MB)\n", stream,
                 total ? 100.0 * double(done) / double(total) : 0.0, done >> 20);
    };

  std::vector<StreamResult> results;
  for (const auto& [name, _] : names) {
    StreamResult res;
    auto ia = sa.find(name), ib = sb.find(name);
    Status s = ia != sa.end() && ib != sb.end()
                   ? compare_stream(name, ia->second, ib->second, options, r.environment,
                                    progress, &res)
                   : count_stream(name, ia != sa.end() ? ia->second : ib->second,
                                  ia != sa.end(), &res);
    if (!s.ok()) return s;
    results.push_back(std::move(res));
  }

  for (StreamResult& res : results) {
    for (EnvDifference& d : res.step_settings)
      if (!has_base_key(r.environment, d)) r.environment.push_back(std::move(d));
  }
  for (StreamResult& res : results) {
    if (res.first && (!r.first || earlier(*res.first, *r.first))) r.first = std::move(res.first);
    for (StructuralDifference& d : res.structural)
      if (r.structural.size() < kMaxStructural) r.structural.push_back(std::move(d));
    r.structural_count += res.structural_count;
    r.divergent_ops += res.divergent_ops;
    for (const auto& [step, n] : res.per_step) r.divergent_ops_per_step[step] += n;
    for (ParameterDivergence& p : res.parameters) r.parameters.push_back(std::move(p));
    r.parameters_tracked += res.parameters_tracked;
    for (Truncation& t : res.truncated) r.truncated.push_back(std::move(t));
    r.beyond_tolerance = r.beyond_tolerance || res.beyond_tolerance;
    r.ops_compared += res.summary.compared;
    r.records_a += res.records_a;
    r.records_b += res.records_b;
    r.bytes_read += res.bytes;
    r.streams.push_back(std::move(res.summary));
  }
  if (r.first) explain_cause(r.environment, &*r.first);
  r.verdict = r.divergent_ops > 0 || r.structural_count > 0 ? "divergent" : "identical";
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report = std::move(r);
  return Status();
}

ExitCode gate_exit_code(const DiffReport& report) {
  if (report.verdict == "identical") return ExitCode::kIdentical;
  if (report.gate.fail_on == "tolerance" && !report.beyond_tolerance) return ExitCode::kIdentical;
  return ExitCode::kDivergent;
}

Status parse_report_format(const std::string& name, ReportFormat* out) {
  static const std::pair<const char*, ReportFormat> kFormats[] = {
      {"text", ReportFormat::kText},
      {"json", ReportFormat::kJson},
      {"junit", ReportFormat::kJunit},
      {"markdown", ReportFormat::kMarkdown},
      {"md", ReportFormat::kMarkdown}};
  for (const auto& [n, f] : kFormats)
    if (name == n) {
      *out = f;
      return Status();
    }
  return Status::error(
      fmt::format("unknown report format '{}' (expected text, json, junit or markdown)", name),
      ExitCode::kUsage);
}

std::string render_report(const DiffReport& report, ReportFormat format, bool color) {
  switch (format) {
    case ReportFormat::kText: return render_text(report, color);
    case ReportFormat::kJson: return report_to_json(report).dump(2) + "\n";
    case ReportFormat::kJunit: return render_junit(report);
    case ReportFormat::kMarkdown: return render_markdown(report);
  }
  return render_text(report, color);
}

}  // namespace detaudit
