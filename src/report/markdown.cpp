// Markdown for CI summaries and pull-request comments.
#include <fmt/format.h>

#include "diff/diff.h"
#include "report/render.h"

namespace detaudit {
namespace {

std::string md_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '|' || c == '`') r += '\\';
    r += c;
  }
  return r;
}

std::string cell(const TensorSide& s) {
  if (!s.present) return "-";
  std::string c = fmt::format("`{}` {} {}", short_digest(s.digest), s.dtype, shape_string(s.sizes));
  if (s.has_stats) c += fmt::format(" mean={:.6g} l2={:.6g}", s.stats.mean, s.stats.l2);
  return c;
}

}  // namespace

std::string render_markdown(const DiffReport& r) {
  std::string out = fmt::format("## detaudit: {}\n\n{}\n\n",
                                gate_exit_code(r) == ExitCode::kIdentical
                                    ? gate_word(r)
                                    : fmt::format("**{}**", gate_word(r)),
                                md_escape(one_line_verdict(r)));
  for (const std::string& n : r.not_compared) out += "> not compared: " + md_escape(n) + "\n\n";
  for (const std::string& n : r.notes) out += "> note: " + md_escape(n) + "\n\n";
  for (const auto& [head, lines] : ending_lines(r)) {
    out += "> ended: " + md_escape(head) + "\n";
    for (const std::string& l : lines) out += "> - " + md_escape(l) + "\n";
    out += "\n";
  }
  if (auto [head, lines] = sentinel_lines(r); !head.empty()) {
    out += "> **" + md_escape(head) + "**\n";
    for (const std::string& l : lines) out += "> - " + md_escape(l) + "\n";
    out += "\n";
  }
  for (auto [head, lines] : {selftest_lines(r), validation_lines(r)}) {
    if (head.empty()) continue;
    out += "> **" + md_escape(head) + "**\n";
    for (const std::string& l : lines) out += "> - " + md_escape(l) + "\n";
    out += "\n";
  }
  if (const auto& v = r.remedy_verification) {
    out += "> **remedy " + md_escape(v->outcome) + "**\n\n";
    for (const RemedyVerification::Round& k : v->rounds)
      out += "> - " +
             md_escape(fmt::format("round {}: `{}`: {}{}", k.round, k.flags, k.verdict,
                                   k.first.empty() ? "" : ", first at " + k.first)) +
             "\n";
    if (!v->rounds.empty()) out += "\n";
  }
  if (const auto& u = r.first_unread)
    out += "> " +
           md_escape(fmt::format("unread: {} difference(s) overwritten before any op read "
                                 "them, not divergences; the first: {} (op #{}, step {}) of {}, "
                                 "overwritten by {}",
                                 r.unread_differences, u->op, u->index, u->step, u->stream,
                                 u->overwritten_by)) +
           "\n\n";
  if (r.first) {
    const FirstDivergence& f = *r.first;
    out += "### First divergence\n\n| field | value |\n|---|---|\n";
    out += fmt::format("| rank | {} |\n| step | {} |\n| phase | {} |\n| op | `{}` |\n", f.rank,
                       f.step, f.phase, md_escape(fmt::format("{}", fmt::join(f.chain, " > "))));
    if (!f.scope_path.empty()) out += fmt::format("| scope | `{}` |\n", md_escape(f.scope_path));
    if (f.optimizer_ordinal > 0)
      out += fmt::format("| stepped by | {} |\n", md_escape(stepping_optimizer(f)));
    if (!f.kernel_origin.empty())
      out += fmt::format("| generated from | {} |\n", md_escape(f.kernel_origin));
    if (!f.evidence.batch_read_by.empty())
      out += fmt::format("| batch read by | {} |\n", md_escape(f.evidence.batch_read_by));
    if (!f.evidence.received_through.empty())
      out += fmt::format("| received through | {} |\n", md_escape(f.evidence.received_through));
    for (const std::string& p : spread_lines(f))
      out += fmt::format("| propagated through | {} |\n", md_escape(p));
    out += fmt::format("| position | op #{} of `{}` |\n| class | {} |\n| detail | {} |\n", f.index,
                       f.stream, f.divergence_class, md_escape(f.evidence.detail));
    if (!f.evidence.confirmed_by.empty())
      out += fmt::format("| counts | {} |\n", md_escape(f.evidence.confirmed_by));
    out += fmt::format("| catalog | {} |\n| cause | {} |\n| remedy | {} |\n\n",
                       f.explanation.catalog ? md_escape(f.explanation.catalog->id) : "-",
                       md_escape(f.explanation.cause), md_escape(f.explanation.remedy));
    if (!f.evidence.inputs.empty() || !f.evidence.outputs.empty()) {
      out += "| tensor | differs | run A | run B |\n|---|---|---|---|\n";
      for (const auto* ps : {&f.evidence.inputs, &f.evidence.outputs})
        for (const TensorPair& p : *ps)
          out += fmt::format("| {} | {} | {} | {} |\n", p.label(), p.differs ? "**yes**" : "no",
                             cell(p.a), cell(p.b));
      out += "\n";
    }
  }
  if (!r.environment.empty()) {
    out += "### Environment differences\n\n| process | key | run A | run B |\n|---|---|---|---|\n";
    for (const EnvDifference& d : r.environment)
      out += fmt::format("| {} | `{}` | {} | {} |\n", d.process, md_escape(d.key), md_escape(d.a),
                         md_escape(d.b));
    out += "\n";
  }
  if (r.structural_count) {
    out += fmt::format("### Structural differences ({})\n\n", r.structural_count);
    for (const StructuralDifference& d : r.structural)
      out += fmt::format("- `{}` step {}: {}\n", d.stream, d.step, md_escape(d.detail));
    out += "\n";
  }
  if (r.divergent_ops) {
    out += fmt::format(
        "### Spread\n\n{} divergent ops; {} of {} tensors the optimizer writes in a step "
        "(parameters and their state) diverged.\n\n",
        r.divergent_ops, r.parameters.size(), r.parameters_tracked);
    out += "| step | divergent ops |\n|---|---|\n";
    size_t k = 0;
    for (const auto& [step, n] : r.divergent_ops_per_step) {
      if (++k > 20) break;
      out += fmt::format("| {} | {} |\n", step, n);
    }
    out += "\n";
  }
  const std::string digests = digests_used(r);
  out += fmt::format("_{} ops compared in {:.2f}s{}_\n", r.ops_compared, r.seconds,
                     digests.empty() ? "" : " (digest: " + digests + ")");
  return out;
}

}  // namespace detaudit
