// The human report: one screen, verdict first, then the first divergence side by side.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "diff/diff.h"
#include "report/render.h"

namespace detaudit {
namespace {

struct Style {
  bool on;
  std::string operator()(const char* code, const std::string& s) const {
    return on ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
  }
};

std::string side_line(const TensorSide& s) {
  if (!s.present) return "-";
  std::string line = fmt::format("{} {} {} {}", short_digest(s.digest), s.dtype,
                                 shape_string(s.sizes), s.device);
  if (s.uninitialized) line += " uninitialized";
  if (s.has_stats)
    line += fmt::format(" min={:.6g} max={:.6g} mean={:.6g} l2={:.6g}", s.stats.min, s.stats.max,
                        s.stats.mean, s.stats.l2);
  if (s.stats.nan || s.stats.inf) line += fmt::format(" nan={} inf={}", s.stats.nan, s.stats.inf);
  return line;
}

void tensors(std::string* out, const Style& st, const std::vector<TensorPair>& ps) {
  for (const TensorPair& p : ps) {
    std::string mark = p.differs ? st("31", "differs") : "same";
    std::string about = p.a.origin;
    if (p.tensor_role != TensorRole::kUnknown)
      about += (about.empty() ? "" : "; ") + std::string(tensor_role_name(p.tensor_role));
    *out += fmt::format("    {} [{}]{}:\n", p.label(), mark,
                        about.empty() ? "" : " (" + about + ")");
    *out += fmt::format("      A {}\n", side_line(p.a));
    if (p.differs || !p.b.present || !p.a.present)
      *out += fmt::format("      B {}\n", side_line(p.b));
  }
}

std::string tolerance_text(const GateConfig& g) {
  std::string t = fmt::format("rtol={} atol={}", g.rtol, g.atol);
  if (g.ulp > 0) t += fmt::format(" ulp={}", g.ulp);
  return t;
}

// How the error grew through the step, op by op: the first few, then the largest and the last.
std::string growth_text(const std::vector<GrowthPoint>& growth, uint64_t step) {
  if (growth.size() < 2) return "";
  auto point = [](const GrowthPoint& g) { return fmt::format("{} {:.2g}", g.op, g.relative); };
  std::string out = fmt::format(
      "    then through step {} ({} divergent op(s), of its scale): ", step, growth.size());
  const size_t shown = std::min<size_t>(growth.size(), 4);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + point(growth[i]);
  if (growth.size() > shown) {
    const auto top = std::max_element(
        growth.begin() + long(shown), growth.end(),
        [](const GrowthPoint& x, const GrowthPoint& y) { return x.relative < y.relative; });
    out += fmt::format(" ... the largest {} (op #{}), the last {}", point(*top), top->index,
                       point(growth.back()));
  }
  return out + "\n";
}

// Where the numerics first left the tolerance, and how the difference grew step by step.
std::string numerics_section(const DiffReport& r, const Style& st) {
  std::string out = st("1", "\nNumerics\n");
  if (const auto& n = r.numerics_change) {
    out += fmt::format(
        "  first beyond tolerance: rank {} step {}, {} phase, {}{} (op #{} of {})\n", n->rank,
        n->step, n->phase, n->op,
        n->replaced_by.empty() ? "" : fmt::format(", replaced by {} in run B", n->replaced_by),
        n->index, n->stream);
    out += fmt::format("    its {} ({}) moved {}; ", n->tensor, n->dtype,
                       deviation_text(n->output_relative, n->output_ulps));
    out += !n->replaced_by.empty() ? "no op before it left the tolerance\n"
           : n->input.empty()      ? "every input it read agreed bit for bit\n"
                                   : fmt::format(
                                         "its inputs stayed within tolerance (the furthest, {}, "
                                              "{})\n",
                                         n->input, deviation_text(n->input_relative, n->input_ulps));
    out += growth_text(n->growth, n->step);
  } else if (r.divergent_ops) {
    double largest = 0;
    for (const auto& [step, p] : r.curve) largest = std::max(largest, p.max_relative);
    out += fmt::format(
        "  no op left the tolerance while its inputs were within it: {} divergent "
        "op(s), the largest {:.2g} of its scale\n",
        r.divergent_ops, largest);
  }
  if (r.structure_matched)
    out += fmt::format(
        "  {} of {} op sequence difference(s) replaced ops with others for the same values: "
        "what each hands on to the ops after it agrees{}\n",
        r.structure_matched, r.structural_count,
        r.gate.fail_on == "tolerance" ? " within the tolerance" : "");
  if (r.structure_tolerated)
    out += fmt::format(
        "  {} op sequence difference(s), replaced alike or as between torch builds (a "
        "decomposition or a default changed): listed, not counted by the gate; the ops after "
        "each are compared\n",
        r.structural_count);
  else if (r.structural_count)
    out += fmt::format(
        "  {} op sequence difference(s): the gate counts them (the same build ran "
        "other ops)\n",
        r.structural_count);
  if (!r.curve.empty()) {
    out += "  largest difference by step (of its scale):";
    size_t k = 0;
    for (const auto& [step, p] : r.curve) {
      if (++k > 12) {
        out += " ...";
        break;
      }
      out += fmt::format(" {}:{:.2g}", step, p.max_relative);
    }
    out += "\n";
  }
  return out;
}

}  // namespace

std::string render_text(const DiffReport& r, bool color) {
  Style st{color};
  std::string out;
  // The gate's word, in green exactly when it passes.
  const bool same = gate_exit_code(r) == ExitCode::kIdentical;
  std::string word = gate_word(r);
  // In capitals but for a parenthesis: "IDENTICAL VALUES (other ops)".
  const size_t plain = std::min(word.find(" ("), word.size());
  for (size_t i = 0; i < plain; ++i) word[i] = char(std::toupper(uint8_t(word[i])));
  const bool warn = r.verdict == Verdict::kIncomplete || r.verdict == Verdict::kNoVerdict;
  // The one-line verdict less the words the headline just said: "DIVERGENT first at ...".
  std::string detail = one_line_verdict(r);
  const std::string said = gate_word(r).substr(0, plain);
  if (detail.rfind(said + ": ", 0) == 0)
    detail.erase(0, said.size() + 2);
  else if (detail.rfind(said + " ", 0) == 0)
    detail.erase(0, said.size() + 1);
  out += fmt::format("{} {}\n", st(same ? "1;32" : warn ? "1;33" : "1;31", word), detail);
  for (const std::string& n : r.not_compared) out += st("33", "  not compared: " + n) + "\n";
  if (const auto& u = r.first_unread)
    out += fmt::format(
        "  unread: {} difference(s) overwritten before any op read them, not "
        "divergences; the first: {} (op #{}, step {}) of {}, overwritten by {}\n",
        r.unread_differences, u->op, u->index, u->step, u->stream, u->overwritten_by);
  out += fmt::format("  A: {}\n  B: {}\n", r.run_a, r.run_b);
  for (const auto& [head, lines] : ending_lines(r)) {
    out += st("33", "  ended: " + head) + "\n";
    for (const std::string& l : lines) out += "    " + l + "\n";
  }
  for (const std::string& n : r.notes) out += "  note: " + n + "\n";
  for (const ResumedProcess& rp : r.resumes) {
    out += fmt::format(
        "  resumed: run {}'s {} continues {} at step {} ({}; {} setup op(s) not "
        "compared)\n",
        rp.run == 0 ? 'A' : 'B', rp.process, rp.continues, rp.step, rp.found_by, rp.setup_ops);
    if (rp.verified)
      out += st("32", fmt::format("    the resume is verified: bit for bit what the run that ran "
                                  "through computed, from step {} on{}",
                                  rp.step,
                                  rp.reordered_ops
                                      ? fmt::format(", but for {} op(s) of its first step that "
                                                    "held the same values in another order "
                                                    "(see the notes)",
                                                    rp.reordered_ops)
                                      : "")) +
             "\n";
    else if (rp.training_verified)
      out += st("32", fmt::format("    training continues exactly: every training-state write "
                                  "agrees from step {} on; only values outside training differ",
                                  rp.step)) +
             "\n";
    if (!rp.verified && !rp.missing.empty())
      out += st("33", "    the checkpoint did not restore " + rp.missing) + "\n";
  }
  if (auto [head, lines] = sentinel_lines(r); !head.empty()) {
    out += st(r.sentinel->divergent ? "33" : "32", "  " + head) + "\n";
    for (const std::string& l : lines) out += "    " + l + "\n";
  }
  if (auto [head, lines] = selftest_lines(r); !head.empty()) {
    out += st(r.selftest->passed ? "32" : "31", "  " + head) + "\n";
    for (const std::string& l : lines) out += "    " + l + "\n";
  }
  if (auto [head, lines] = validation_lines(r); !head.empty()) {
    out += st(r.validation->failed ? "31" : "32", "  " + head) + "\n";
    for (const std::string& l : lines) out += "    " + l + "\n";
  }
  if (const auto& v = r.remedy_verification) {
    out += st(v->verified ? "32" : "33", "  remedy " + v->outcome) + "\n";
    for (const RemedyVerification::Round& k : v->rounds)
      out += fmt::format("    round {}: {}: {}{} ({})\n", k.round, k.flags, k.verdict,
                         k.first.empty() ? "" : ", first at " + k.first, k.runs);
  }
  for (const ReplicaCheck& c : r.replicas)
    if (c.divergence || !c.not_checked.empty()) out += render_replica_check(c);
  if (r.training.identical)
    out += st("32", fmt::format(
                        "  training: identical, the {} training-state writes compared "
                        "agree; {}{}",
                        r.training.writes_compared, outside_training(r),
                        r.training.divergent_outside > r.training.outside.size() ? ", ..." : "")) +
           "\n";
  else if (r.gate.fail_on == "training" && r.verdict == Verdict::kDivergent)
    out += st("31", fmt::format("  training: differs ({} divergent training-state write(s){})",
                                r.training.divergent_writes,
                                r.structural_count ? ", and the op sequences differ" : "")) +
           "\n";
  if (!same && r.gate.fail_on == "tolerance")
    out += fmt::format("  gate: tolerance {}: {}\n", tolerance_text(r.gate),
                       r.beyond_tolerance ? "beyond tolerance (fails)" : "within tolerance");

  std::vector<std::string> regions;
  uint64_t kernels_a = 0, kernels_b = 0;
  for (const StreamSummary& s : r.streams) {
    kernels_a += s.compiled_kernels;
    kernels_b += s.compiled_kernels_b;
    for (const std::string& name : s.compiled_regions)
      if (std::find(regions.begin(), regions.end(), name) == regions.end()) regions.push_back(name);
  }
  for (const StreamSummary& s : r.streams)
    if (s.consumer_last_step)
      out += fmt::format(
          "  worker: {} compared up to step {}, the last its consumer ran (later "
          "batches were prefetched as timing allowed)\n",
          s.name, *s.consumer_last_step);
  if (!regions.empty() && kernels_a + kernels_b)
    out += fmt::format(
        "  compiled: torch.compile regions ran ({}); their generated kernel calls were recorded "
        "as inductor_kernel::<kernel>, {} in run A and {} in run B\n",
        fmt::join(regions, ", "), kernels_a, kernels_b);
  else if (!regions.empty())
    out += fmt::format(
        "  opaque: torch.compile regions ran ({}); the kernels inside them are not "
        "recorded, so a divergence inside one shows only at its outputs\n",
        fmt::join(regions, ", "));

  if (!r.environment.empty()) {
    out += st("1", "\nEnvironment differences\n");
    size_t shown = 0;
    for (const EnvDifference& d : r.environment) {
      if (++shown > 12) {
        out += fmt::format("  ... {} more\n", r.environment.size() - 12);
        break;
      }
      out += fmt::format("  {} {}: {} vs {}\n", d.process, d.key, d.a, d.b);
    }
  }

  if (r.first) {
    const FirstDivergence& f = *r.first;
    out += st("1", "\nFirst divergence\n");
    // A resumed process's stream: each run's process by its own name.
    std::string process = f.process;
    for (const ResumedProcess& rp : r.resumes)
      if (f.stream.rfind(rp.process + ".", 0) == 0)
        process = rp.run == 0 ? fmt::format("{} in run A, {} in run B", rp.process, rp.continues)
                              : fmt::format("{} in run A, {} in run B", rp.continues, rp.process);
    const std::string optimizer = stepping_optimizer(f);
    out += fmt::format("  where: rank {} ({}), step {}{}, {} phase, op #{} of stream {}\n", f.rank,
                       process, f.step, optimizer.empty() ? "" : fmt::format(" ({})", optimizer),
                       f.phase, f.index, f.stream);
    out += fmt::format("  op:    {}{}\n", st("1", fmt::format("{}", fmt::join(f.chain, " > "))),
                       f.scope_path.empty() ? "" : fmt::format(" in `{}`", f.scope_path));
    if (!f.evidence.batch_read_by.empty())
      out += fmt::format("  batch: made in this DataLoader worker for step {}, read by {}\n",
                         f.step, f.evidence.batch_read_by);
    out += fmt::format("  class: {} - {}\n", st("35", divergence_class_name(f.divergence_class)),
                       f.evidence.detail);
    if (!f.evidence.confirmed_by.empty())
      out += fmt::format("  counts: {}\n", f.evidence.confirmed_by);
    for (const std::string& p : spread_lines(f))
      out += fmt::format("  spread: {}{}\n", p.rfind("...", 0) == 0 ? "" : "propagated through ",
                         p);
    if (!f.kernel_origin.empty())
      out += fmt::format("  kernel: generated by torch.compile from {}\n", f.kernel_origin);
    else if (!f.evidence.compiled_region.empty())
      out += fmt::format("  region: {} (torch.compile, opaque), the last to run before this op\n",
                         f.evidence.compiled_region);
    if (f.evidence.is_random)
      out += fmt::format("  rng:   {:016x} vs {:016x}\n", f.evidence.rng_a, f.evidence.rng_b);
    if (!f.evidence.inputs.empty() || !f.evidence.outputs.empty()) {
      out += "  tensors (A, then B where it differs):\n";
      tensors(&out, st, f.evidence.inputs);
      tensors(&out, st, f.evidence.outputs);
    }
    for (const StatsDelta& d : f.evidence.magnitude) {
      if (!d.has_stats) {
        out += fmt::format("  magnitude: {}: no statistics recorded\n", d.tensor);
        continue;
      }
      out += fmt::format("  magnitude: {}: dmin={:.3g} dmax={:.3g} dmean={:.3g} dl2={:.3g}",
                         d.tensor, d.min, d.max, d.mean, d.l2);
      if (d.relative > 0) out += ", " + deviation_text(d.relative, d.ulps);
      if (d.nan || d.inf) out += fmt::format(" dnan={} dinf={}", d.nan, d.inf);
      out += "\n";
    }
    if (f.explanation.catalog) {
      out += fmt::format("  catalog: {} ({}){}\n", f.explanation.catalog->id,
                         f.explanation.catalog->condition,
                         f.explanation.catalog->uncertain
                             ? " [uncertain: " + f.explanation.catalog->uncertainty + "]"
                             : "");
      if (!f.explanation.catalog->conditions_met.empty())
        out += fmt::format("    conditions met: {}\n",
                           fmt::join(f.explanation.catalog->conditions_met, "; "));
    }
    if (!f.explanation.cause.empty())
      out += fmt::format("  cause:  {}\n", st("1;33", f.explanation.cause));
    if (!f.explanation.remedy.empty())
      out += fmt::format("  remedy: {}\n", st("32", f.explanation.remedy));
  }

  if (r.structural_count) {
    out += st("1", fmt::format("\nStructural differences ({})\n", r.structural_count));
    for (size_t i = 0; i < r.structural.size() && i < 5; ++i) {
      const StructuralDifference& d = r.structural[i];
      out += fmt::format("  {} step {} op #{}/#{}: {}\n", d.stream, d.step, d.index_a, d.index_b,
                         d.detail);
    }
  }
  if (r.divergent_ops) {
    out += st("1", "\nSpread\n");
    out += fmt::format("  {} divergent ops; by step:", r.divergent_ops);
    size_t k = 0;
    for (const auto& [step, n] : r.divergent_ops_per_step) {
      if (++k > 10) {
        out += " ...";
        break;
      }
      out += fmt::format(" {}:{}", step, n);
    }
    out += "\n";
    if (r.parameters_tracked)
      out += fmt::format(
          "  optimizer writes (parameters and their state, a position a tensor): {} of {} "
          "diverged{}\n",
          r.parameters.size(), r.parameters_tracked,
          r.parameters.empty()
              ? ""
              : fmt::format(", first at step {}", r.parameters.front().first_step));
  }
  if (r.gate.fail_on == "tolerance" && !same) out += numerics_section(r, st);
  const std::string digests = digests_used(r);
  out += fmt::format("\n{} ops compared in {:.2f}s{}\n", r.ops_compared, r.seconds,
                     digests.empty() ? "" : " (digest: " + digests + ")");
  return out;
}

}  // namespace detaudit
