// render_report: the report format by name, and the renderer of each.
#include "report/render.h"

#include <fmt/format.h>

namespace detaudit {

Status parse_report_format(const std::string& name, ReportFormat* out) {
  static const std::pair<const char*, ReportFormat> kFormats[] = {
      {"text", ReportFormat::kText},   {"json", ReportFormat::kJson},
      {"junit", ReportFormat::kJunit}, {"markdown", ReportFormat::kMarkdown},
      {"md", ReportFormat::kMarkdown}, {"html", ReportFormat::kHtml}};
  for (const auto& [n, f] : kFormats)
    if (name == n) {
      *out = f;
      return Status();
    }
  return Status::error(
      fmt::format("unknown report format '{}' (expected text, json, junit, markdown or html)",
                  name),
      ExitCode::kUsage);
}

std::string render_report(const DiffReport& report, ReportFormat format, bool color) {
  switch (format) {
    case ReportFormat::kText: return render_text(report, color);
    // Op names need not be UTF-8 (a C++ program names its own scopes): replaced, never thrown on.
    case ReportFormat::kJson:
      return report_to_json(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
    case ReportFormat::kJunit: return render_junit(report);
    case ReportFormat::kMarkdown: return render_markdown(report);
    case ReportFormat::kHtml: return render_html(report);
  }
  return render_text(report, color);
}

}  // namespace detaudit

namespace detaudit {

std::string stepping_optimizer(const FirstDivergence& f) {
  if (f.optimizer_ordinal == 0) return "";
  std::string what = fmt::format("{} over {} tensor{}", f.optimizer, f.optimizer_tensors,
                                 f.optimizer_tensors == 1 ? "" : "s");
  if (f.optimizers < 2) return what;
  const uint64_t n = f.optimizer_ordinal;
  const char* suffix = n % 100 / 10 == 1 ? "th"
                       : n % 10 == 1     ? "st"
                       : n % 10 == 2     ? "nd"
                       : n % 10 == 3     ? "rd"
                                         : "th";
  return fmt::format("the {}{} of {} optimizers, {}", n, suffix, f.optimizers, what);
}

std::pair<std::string, std::vector<std::string>> selftest_lines(const DiffReport& r) {
  if (!r.selftest) return {};
  std::vector<std::string> lines;
  for (const SelfTest::Plant& k : r.selftest->plants)
    lines.push_back(fmt::format("{}: {} ({})", k.kind, k.line, k.run));
  for (const std::string& n : r.selftest->notes) lines.push_back("not planted: " + n);
  return {"self-test: " + r.selftest->outcome, lines};
}

std::pair<std::string, std::vector<std::string>> validation_lines(const DiffReport& r) {
  if (!r.validation) return {};
  std::vector<std::string> lines;
  if (!r.validation->sentinel.empty()) lines.push_back(r.validation->sentinel);
  lines.push_back("runs without recording: " + r.validation->runs);
  return {"validate: " + r.validation->outcome, lines};
}

std::pair<std::string, std::vector<std::string>> sentinel_lines(const DiffReport& r) {
  if (!r.sentinel) return {};
  const SentinelFinding& s = *r.sentinel;
  if (!s.divergent) {
    // Claimed only for what was compared: the tensors the optimizer's ops wrote, and the loss.
    const std::string loss = r.loss.empty() ? "" : " and loss";
    if (r.parameters_tracked == 0)
      return {fmt::format("sentinel: no optimizer op wrote a tensor it could compare; {} ({})",
                          r.loss.empty() ? "nothing was compared" : "only the loss agrees", s.runs),
              {}};
    return {fmt::format("sentinel: every step's optimizer writes ({} tensors a step: parameters "
                        "and their state){} agree ({})",
                        r.parameters_tracked, loss, s.runs),
            {}};
  }
  if (s.first.empty())
    return {fmt::format("sentinel: the runs differ ({}), at no op to name a step by", s.runs), {}};
  std::vector<std::string> lines;
  lines.push_back("first: " + s.first);
  for (const std::string& t : s.tensors) lines.push_back(t);
  if (!s.generator.empty()) lines.push_back(s.generator);
  lines.push_back(fmt::format("{} step(s) with a difference", s.steps_divergent));
  for (const std::string& m : s.moved) lines.push_back(m);
  if (s.came_back)
    lines.push_back(fmt::format("step(s) {} recorded in full ({}): the op above is where it began",
                                s.full_steps, s.full_runs));
  if (!s.note.empty()) lines.push_back(s.note);
  for (const std::string& c : s.catalog_ops) lines.push_back("catalog op that ran: " + c);
  if (!s.came_back && !s.command.empty()) lines.push_back("to record from there: " + s.command);
  return {fmt::format("sentinel: the runs first differ at step {} ({})", s.step, s.runs),
          std::move(lines)};
}

}  // namespace detaudit
