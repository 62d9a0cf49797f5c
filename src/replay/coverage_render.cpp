// The coverage report in each format: one row per op type (docs/report.md, "Coverage").
#include <fmt/format.h>

#include <algorithm>

#include "replay/coverage.h"
#include "report/render.h"

namespace detaudit::replay {
using nlohmann::json;

namespace {

int max_distinct(const OpTypeRow& row) {
  int k = 0;
  for (const ReplaySeries& s : row.series)
    if (s.error.empty()) k = std::max(k, s.distinct);
  return k;
}

std::string catalog_label(const OpTypeRow& row) {
  if (!row.catalog_ids.empty()) return fmt::format("{}", fmt::join(row.catalog_ids, ", "));
  return row.verdict == Coverage::kNondeterministic ? "not in the catalog: worth an entry" : "-";
}

std::string summary_line(const CoverageReport& r) {
  return fmt::format(
      "{} op types: {} verified nondeterministic{}, {} deterministic in {} replays, {} unverified",
      r.rows.size(), r.nondeterministic,
      r.unknown_to_catalog ? fmt::format(" ({} not in the catalog)", r.unknown_to_catalog) : "",
      r.deterministic, r.replays, r.unverified);
}

std::string budget_line(const CoverageReport& r) {
  return fmt::format("{:.0f} s of a {:.0f} s budget, {} replayer{} at once", r.spent_s, r.budget_s,
                     r.workers, r.workers == 1 ? "" : "s");
}

}  // namespace

json coverage_to_json(const CoverageReport& r) {
  json rows = json::array();
  for (const OpTypeRow& row : r.rows) {
    json series = json::array();
    for (const ReplaySeries& s : row.series) {
      json j = {{"setting", s.setting},           {"replays", s.replays},
                {"threads", s.threads},           {"deterministic", s.deterministic},
                {"busy_thread", s.busy_thread},   {"distinct", s.distinct},
                {"max_abs_diff", s.max_abs_diff}, {"matching_recorded", s.matching_recorded},
                {"cores_used", s.cores_used}};
      if (!s.error.empty()) j["error"] = s.error;
      series.push_back(std::move(j));
    }
    rows.push_back({{"op", row.op},
                    {"dtype", row.dtype},
                    {"device", row.device},
                    {"shape_class", row.shape_class},
                    {"occurrences", row.occurrences},
                    {"random", row.random},
                    {"bytes", row.bytes},
                    {"verdict", coverage_name(row.verdict)},
                    {"why", row.why},
                    {"distinct", max_distinct(row)},
                    {"replayed",
                     {{"stream", row.target.stream},
                      {"index", row.target.index},
                      {"step", row.target.step},
                      {"phase", row.target.phase}}},
                    {"capture", row.capture_status},
                    {"catalog", row.catalog_ids},
                    {"remedy", row.remedy},
                    {"series", series}});
  }
  return {{"schema", "detaudit.coverage/1"},
          {"run", r.run_dir},
          {"digest", r.digest},
          {"replays", r.replays},
          {"budget_s", r.budget_s},
          {"spent_s", r.spent_s},
          {"workers", r.workers},
          {"ops_scanned", r.ops_scanned},
          {"counts",
           {{"verified_nondeterministic", r.nondeterministic},
            {"deterministic", r.deterministic},
            {"unverified", r.unverified},
            {"not_in_catalog", r.unknown_to_catalog}}},
          {"summary", summary_line(r)},
          {"op_types", rows}};
}

std::string render_coverage_text(const CoverageReport& r, bool color) {
  auto paint = [&](const std::string& s, const char* code) {
    return color ? fmt::format("\033[{}m{}\033[0m", code, s) : s;
  };
  auto label = [](const OpTypeRow& row) {
    return fmt::format("{} [{}, {}, {}] x{}", row.op, row.dtype, row.device, row.shape_class,
                       row.occurrences);
  };
  std::string out = fmt::format("detaudit coverage of {}\n{}\n({})\n", r.run_dir, summary_line(r),
                                budget_line(r));
  if (r.nondeterministic) out += "\n" + paint("VERIFIED NONDETERMINISTIC", "1;31") + "\n";
  for (const OpTypeRow& row : r.rows) {
    if (row.verdict != Coverage::kNondeterministic) continue;
    out += fmt::format("  {}\n    {}\n    catalog: {}\n", label(row), row.why, catalog_label(row));
    if (!row.remedy.empty()) out += fmt::format("    remedy: {}\n", row.remedy);
    out += fmt::format("    replayed: {} #{} (step {}, {})\n", row.target.stream, row.target.index,
                       row.target.step, row.target.phase);
  }
  // Unverified types by reason: most share one (autograd nodes, uninitialized outputs).
  std::vector<std::pair<std::string, std::vector<std::string>>> reasons;
  for (const OpTypeRow& row : r.rows) {
    if (row.verdict != Coverage::kUnverified) continue;
    auto it = std::find_if(reasons.begin(), reasons.end(),
                           [&](const auto& g) { return g.first == row.why; });
    if (it == reasons.end()) it = reasons.insert(reasons.end(), {row.why, {}});
    it->second.push_back(label(row));
  }
  if (r.unverified) out += "\n" + paint(fmt::format("UNVERIFIED ({})", r.unverified), "33") + "\n";
  for (const auto& [why, rows] : reasons)
    out += fmt::format("  {}:\n    {}\n", why, fmt::join(rows, "\n    "));
  if (r.deterministic)
    out += "\n" +
           paint(fmt::format("DETERMINISTIC in {} replays ({})", r.replays, r.deterministic),
                 "32") +
           "\n";
  for (const OpTypeRow& row : r.rows)
    if (row.verdict == Coverage::kDeterministic)
      out += fmt::format("  {}\n    {}\n", label(row), row.why);
  return out;
}

std::string render_coverage_markdown(const CoverageReport& r) {
  std::string out = fmt::format("# detaudit coverage\n\n`{}`: {} ({}).\n\n", r.run_dir,
                                summary_line(r), budget_line(r));
  out += "| verdict | op | dtype | device | shape | runs | distinct | catalog | evidence |\n";
  out += "|---|---|---|---|---|---:|---:|---|---|\n";
  auto cell = [](std::string s) {
    std::string o;
    for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
    return o;
  };
  for (const OpTypeRow& row : r.rows)
    out += fmt::format("| {} | `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
                       coverage_name(row.verdict), row.op, row.dtype, row.device, row.shape_class,
                       row.occurrences, max_distinct(row), cell(catalog_label(row)), cell(row.why));
  return out;
}

std::string render_coverage_junit(const CoverageReport& r) {
  std::string cases;
  int skipped = 0;
  for (const OpTypeRow& row : r.rows) {
    std::string body;
    if (row.verdict == Coverage::kNondeterministic)
      body = fmt::format("<failure message=\"{}\">{}</failure>", escape_markup(row.why),
                         escape_markup("catalog: " + catalog_label(row) +
                                       (row.remedy.empty() ? "" : "\nremedy: " + row.remedy)));
    else if (row.verdict == Coverage::kUnverified)
      body = fmt::format("<skipped message=\"{}\"/>", escape_markup(row.why)), ++skipped;
    else
      body = "<system-out>" + escape_markup(row.why) + "</system-out>";
    cases += fmt::format("  <testcase classname=\"detaudit.coverage\" name=\"{}\">{}</testcase>\n",
                         escape_markup(row.key()), body);
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"detaudit\" tests=\"{0}\" "
      "failures=\"{1}\">\n<testsuite name=\"detaudit coverage\" tests=\"{0}\" failures=\"{1}\" "
      "skipped=\"{2}\" errors=\"0\">\n{3}</testsuite>\n</testsuites>\n",
      r.rows.size(), r.nondeterministic, skipped, cases);
}

std::string render_coverage_html(const CoverageReport& r) {
  // The plot: distinct outputs per replayed op type, one bar each (1 = deterministic).
  std::vector<const OpTypeRow*> plotted;
  for (const OpTypeRow& row : r.rows)
    if (row.verdict != Coverage::kUnverified) plotted.push_back(&row);
  int top = 1;
  for (const OpTypeRow* row : plotted) top = std::max(top, max_distinct(*row));
  const int bar = 18, label_w = 420, plot_w = 360;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"distinct outputs per op type\">",
      label_w + plot_w + 60, int(plotted.size()) * bar + 24);
  for (size_t i = 0; i < plotted.size(); ++i) {
    const OpTypeRow& row = *plotted[i];
    const int k = max_distinct(row);
    const int y = int(i) * bar;
    const int w = std::max(2, plot_w * k / top);
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"12\">{}</text>"
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect>"
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>",
        label_w - 6, y + 13, escape_markup(row.key()), label_w, y + 2, w, bar - 4,
        row.verdict == Coverage::kNondeterministic ? "#c62828" : "#2e7d32", escape_markup(row.why),
        label_w + w + 4, y + 13, k);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"12\">distinct outputs in {} replays (1: the same "
      "bits every time)</text></svg>",
      label_w, int(plotted.size()) * bar + 16, r.replays);
  std::string rows;
  for (const OpTypeRow& row : r.rows)
    rows += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        coverage_name(row.verdict), coverage_name(row.verdict), escape_markup(row.op),
        escape_markup(row.dtype), escape_markup(row.device), escape_markup(row.shape_class),
        row.occurrences, max_distinct(row), escape_markup(catalog_label(row)),
        escape_markup(row.why));
  return fmt::format(
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>detaudit coverage</title>"
      "<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}"
      "td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}"
      ".verified-nondeterministic td:first-child{{color:#c62828;font-weight:bold}}"
      ".unverified td:first-child{{color:#9a6700}}.deterministic td:first-child{{color:#2e7d32}}"
      "</style></head><body><h1>detaudit coverage</h1><p><code>{}</code>: {} ({}).</p>{}"
      "<table><tr><th>verdict</th><th>op</th><th>dtype</th><th>device</th><th>shape</th>"
      "<th>runs</th><th>distinct</th><th>catalog</th><th>evidence</th></tr>{}</table>"
      "</body></html>\n",
      escape_markup(r.run_dir), escape_markup(summary_line(r)), escape_markup(budget_line(r)), svg,
      rows);
}

}  // namespace detaudit::replay
