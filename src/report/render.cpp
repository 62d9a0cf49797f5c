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
