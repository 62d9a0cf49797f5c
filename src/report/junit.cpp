// JUnit XML for CI pages: one test case per compared stream, failing where it diverged.
#include <fmt/format.h>

#include "diff/diff.h"
#include "report/render.h"

namespace detaudit {
namespace {

std::string xml_escape(const std::string& s) { return escape_markup(s); }

}  // namespace

std::string render_junit(const DiffReport& r) {
  bool fails = gate_exit_code(r) != ExitCode::kIdentical;
  size_t failures = 0;
  std::string cases;
  // The verdict itself is one case, so a CI page always shows it.
  {
    std::string body;
    if (fails) {
      ++failures;
      std::string text = render_text(r, false);
      body = fmt::format("<failure message=\"{}\" type=\"{}\">{}</failure>",
                         xml_escape(one_line_verdict(r)),
                         r.first ? xml_escape(divergence_class_name(r.first->divergence_class))
                                 : xml_escape(verdict_name(r.verdict)),
                         xml_escape(text));
    }
    std::string endings;
    for (const auto& [head, lines] : ending_lines(r)) {
      endings += head + "\n";
      for (const std::string& l : lines) endings += "  " + l + "\n";
    }
    if (!endings.empty()) body += "<system-out>" + xml_escape(endings) + "</system-out>";
    cases += fmt::format(
        "  <testcase classname=\"detaudit\" name=\"verdict\" time=\"{:.3f}\">{}"
        "</testcase>\n",
        r.seconds, body);
  }
  for (const StreamSummary& s : r.streams) {
    std::string body;
    bool bad = s.divergent || s.structural;
    if (bad && fails) {
      ++failures;
      body = fmt::format("<failure message=\"{} divergent ops, {} structural differences\"/>",
                         s.divergent, s.structural);
    }
    if (s.truncated) body += "<system-out>truncated: compared up to the cut</system-out>";
    cases += fmt::format("  <testcase classname=\"detaudit.streams\" name=\"{}\">{}</testcase>\n",
                         xml_escape(s.name), body);
  }
  for (const PoolComparison& c : r.library_pools) {
    std::string body;
    if ((c.unmatched_a || c.unmatched_b) && fails) {
      ++failures;
      body = fmt::format("<failure message=\"{} ops of run A and {} of run B unmatched\"/>",
                         c.unmatched_a, c.unmatched_b);
    }
    body += "<system-out>" + xml_escape(c.pool->why) + ": compared as one set</system-out>";
    cases += fmt::format(
        "  <testcase classname=\"detaudit.library_threads\" name=\"{} {}\">{}"
        "</testcase>\n",
        xml_escape(c.process), c.pool->thread, body);
  }
  size_t extra = 0;
  if (auto [head, lines] = sentinel_lines(r); !head.empty()) {
    // Said beside the op-level cases; its failure is the divergence they already count.
    std::string text = head + "\n";
    for (const std::string& l : lines) text += l + "\n";
    cases += fmt::format(
        "  <testcase classname=\"detaudit\" name=\"sentinel\"><system-out>{}</system-out>"
        "</testcase>\n",
        xml_escape(text));
    ++extra;
  }
  for (const auto& [name, check] :
       {std::pair{"selftest", selftest_lines(r)}, std::pair{"validate", validation_lines(r)}}) {
    const auto& [head, lines] = check;
    if (head.empty()) continue;
    // A plant not found, or a divergence recording hid, is a failure of its own.
    std::string body;
    const bool failed = std::string(name) == "selftest" ? !r.selftest->passed
                                                        : r.validation->failed;
    if (failed) {
      ++failures;
      body = fmt::format("<failure message=\"{}\"/>", xml_escape(head));
    }
    std::string text = head + "\n";
    for (const std::string& l : lines) text += l + "\n";
    body += "<system-out>" + xml_escape(text) + "</system-out>";
    cases += fmt::format("  <testcase classname=\"detaudit\" name=\"{}\">{}</testcase>\n", name,
                         body);
    ++extra;
  }
  if (const auto& v = r.remedy_verification) {
    // A remedy that did not make the runs identical is a failure of its own.
    std::string body;
    if (!v->verified) {
      ++failures;
      body = fmt::format("<failure message=\"{}\"/>", xml_escape(v->outcome));
    }
    std::string rounds;
    for (const RemedyVerification::Round& k : v->rounds)
      rounds += fmt::format("round {}: {}: {}{}\n", k.round, k.flags, k.verdict,
                            k.first.empty() ? "" : ", first at " + k.first);
    body += "<system-out>" + xml_escape(v->outcome + "\n" + rounds) + "</system-out>";
    cases += fmt::format("  <testcase classname=\"detaudit\" name=\"remedy\">{}</testcase>\n",
                         body);
    ++extra;
  }
  std::string props;
  for (const EnvDifference& d : r.environment)
    props += fmt::format("    <property name=\"{}\" value=\"{}\"/>\n",
                         xml_escape(d.process + " " + d.key), xml_escape(d.a + " vs " + d.b));
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<testsuites name=\"detaudit\" tests=\"{0}\" failures=\"{1}\">\n"
      "<testsuite name=\"detaudit diff\" tests=\"{0}\" failures=\"{1}\" errors=\"0\" "
      "time=\"{2:.3f}\">\n  <properties>\n{3}  </properties>\n{4}</testsuite>\n</testsuites>\n",
      r.streams.size() + r.library_pools.size() + 1 + extra, failures, r.seconds, props, cases);
}

}  // namespace detaudit
