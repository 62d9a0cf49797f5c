// A diff's report in each format: render_report picks the renderer, one file per format.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diff/report_model.h"
#include "util/status.h"

namespace detaudit {

enum class ReportFormat { kText, kJson, kJunit, kMarkdown, kHtml };
// "text", "json", "junit", "markdown" (or "md"), "html"; a usage error names the five.
Status parse_report_format(const std::string& name, ReportFormat* out);
std::string render_report(const DiffReport& report, ReportFormat format, bool color);

std::string render_text(const DiffReport& r, bool color);
nlohmann::json report_to_json(const DiffReport& r);  // the schema of docs/report.md
// Its "remedy_verification", which `run --verify-remedy` also writes as OUT/remedy.json.
nlohmann::json remedy_verification_to_json(const RemedyVerification& v);
// Its "selftest", which `run --selftest` also writes as OUT/selftest.json.
nlohmann::json selftest_to_json(const SelfTest& t);
nlohmann::json validation_to_json(const Validation& v);
std::string render_junit(const DiffReport& r);
std::string render_markdown(const DiffReport& r);
std::string render_html(const DiffReport& r);  // self-contained: inline CSS and SVG

// Shared helpers.
// &, <, >, " and ' as entities, other control characters but newline and tab as spaces: for
// HTML and XML alike.
std::string escape_markup(std::string_view s);
std::string shape_string(const std::vector<int64_t>& sizes);
std::string short_digest(const std::string& hex);  // first 12 hex digits
std::string one_line_verdict(const DiffReport& r);
// "3.1e-06 of its scale (26 ulp)": how far a tensor's statistics moved (docs/report.md).
std::string deviation_text(double relative, double ulps);
// "3 op(s) outside training differ: aten::add_ (step 4), ...": the divergent ops that write no
// training state (TrainingCheck), the first few.
std::string outside_training(const DiffReport& r);
// How the runs ended, when a program failed or a process did not exit: per run a headline ("run
// B's program failed (exit code 1); what both runs recorded is identical"), then one line per
// process (diff/endings.h). Empty when every process exited.
std::vector<std::pair<std::string, std::vector<std::string>>> ending_lines(const DiffReport& r);
// `run --sentinel`: a headline ("sentinel: runs part at step 900 ...") and its lines; an empty
// headline when the report has no sentinel finding.
std::pair<std::string, std::vector<std::string>> sentinel_lines(const DiffReport& r);
// `run --selftest`'s head ("self-test: 3 of 3 plants found at their op") and a line a plant;
// empty when there was none.
std::pair<std::string, std::vector<std::string>> selftest_lines(const DiffReport& r);
// `run --validate`'s head ("validate: validated: ...") and its lines; empty when there was none.
std::pair<std::string, std::vector<std::string>> validation_lines(const DiffReport& r);
// The digests the streams were recorded with, "md5" or "device, md5" ("" if no stream).
std::string digests_used(const DiffReport& r);
// The first divergence's spread as the human formats show it: a thousand ranks' all-reduce is
// the first few lines and "and N more ranks" (JSON keeps every one).
std::vector<std::string> spread_lines(const FirstDivergence& f);
// The optimizer whose step the first divergence's step is: "the 1st of 2 optimizers, Adam over 7
// tensors", "Adam over 7 tensors" for a program's only one; "" where none was labelled.
std::string stepping_optimizer(const FirstDivergence& f);

}  // namespace detaudit
