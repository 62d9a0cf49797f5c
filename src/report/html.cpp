// The report to look at: one self-contained HTML file (inline CSS and SVG, no script, nothing
// fetched), verdict first, then the first divergence as a card and the plots that show where
// the runs part and how the difference grows.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <tuple>

#include "diff/diff.h"
#include "diff/risk.h"
#include "report/render.h"

namespace detaudit {
namespace {

// Colours the tests look for in a screenshot: keep them distinct from the page's greys.
constexpr const char* kBarColour = "#e45756";   // divergent ops
constexpr const char* kLineColour = "#4c78a8";  // largest relative difference; loss of A
constexpr const char* kLossB = "#f58518";
constexpr const char* kLossDiff = "#54a24b";

std::string esc(std::string_view s) { return escape_markup(s); }

std::string html_number(double v) { return fmt::format("{:.6g}", v); }

const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:16px 24px}
.banner{padding:18px 24px;color:#fff;font-size:20px}
.banner.identical{background:#2e7d32}.banner.divergent{background:#b71c1c}
.banner.incomplete{background:#e65100}
.banner small{display:block;font-size:13px;opacity:.9}
section{background:#fff;border:1px solid #ddd;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:4px 0 10px}
table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}
th{color:#555;font-weight:600}
code{font:12px ui-monospace,monospace;background:#f3f3f3;padding:1px 3px;border-radius:3px}
.differs{color:#b71c1c;font-weight:600}.same{color:#2e7d32}
.class{display:inline-block;background:#6a1b9a;color:#fff;border-radius:3px;padding:0 6px}
.muted{color:#777}
svg text{font:11px system-ui,sans-serif;fill:#444}
)";

std::string page(const std::string& title, const std::string& body) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width\"><title>{}</title>"
      "<style>{}</style></head><body>\n{}\n</body></html>\n",
      esc(title), kStyle, body);
}

// A chart's frame: x by position among `steps`, left axis linear, right axis log10.
struct Frame {
  double width = 1000, height = 260, left = 60, right = 70, top = 20, bottom = 40;
  size_t n = 1;
  double x(size_t i) const { return left + slot() * (double(i) + 0.5); }
  double slot() const { return (width - left - right) / double(std::max<size_t>(n, 1)); }
  double y(double fraction) const { return top + (height - top - bottom) * (1 - fraction); }
};

std::string axes(const Frame& f, const std::vector<uint64_t>& steps, const char* x_label = "step") {
  std::string s = fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#999\"/>"
      "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#999\"/>",
      f.left, f.y(0), f.width - f.right, f.y(1));
  const size_t every = std::max<size_t>(1, steps.size() / 20);
  for (size_t i = 0; i < steps.size(); i += every)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", f.x(i),
                     f.y(0) + 16, steps[i]);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>",
                   (f.left + f.width - f.right) / 2, f.height - 4, x_label);
  return s;
}

// log10 range covering the positive values, at least two decades.
std::pair<double, double> log_range(const std::vector<double>& values) {
  double lo = 1e300, hi = 0;
  for (double v : values)
    if (v > 0 && std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (hi == 0) return {-8, 0};
  double a = std::floor(std::log10(lo)), b = std::ceil(std::log10(hi));
  if (b - a < 2) a = b - 2;
  return {a, b};
}

// A line through the positive values on a log scale [1e`lo`, 1e`hi`], a point each: `circle(i,
// x, y)` draws it.
template <typename CircleFn>
std::string log_line(const Frame& f, const std::vector<double>& values, double lo, double hi,
                     int stroke_width, CircleFn circle) {
  std::string s, points;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(values[i] > 0) || !std::isfinite(values[i])) continue;
    const double y = f.y((std::log10(values[i]) - lo) / (hi - lo));
    points += fmt::format("{:.1f},{:.1f} ", f.x(i), y);
    s += circle(i, f.x(i), y);
  }
  if (!points.empty())
    s += fmt::format(
        "<polyline class=\"rel\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"{}\"/>",
        points, kLineColour, stroke_width);
  return s;
}

// Divergent ops per step (bars, left axis) and the largest relative difference (line, log
// scale, right axis): how fast the difference blows up.
std::string growth_plot(const DiffReport& r) {
  std::vector<uint64_t> steps;
  std::vector<double> counts, rel;
  for (const auto& [step, p] : r.curve) {
    steps.push_back(step);
    counts.push_back(double(p.divergent_ops));
    rel.push_back(p.max_relative);
  }
  if (steps.empty()) return "<p class=\"muted\">No op diverged: nothing to plot.</p>";
  Frame f;
  f.n = steps.size();
  const double max_count = *std::max_element(counts.begin(), counts.end());
  auto [lo, hi] = log_range(rel);
  std::string s = fmt::format(
      "<svg id=\"growth-plot\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
      "aria-label=\"divergent ops and largest relative difference per step\">",
      f.width, f.height);
  s += axes(f, steps);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#999\"/>",
                   f.width - f.right, f.y(0), f.y(1));
  s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>", f.left - 6,
                   f.y(1) + 4, max_count);
  s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">0</text>", f.left - 6,
                   f.y(0) + 4);
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" transform=\"rotate(-90 {} {:.1f})\" "
      "text-anchor=\"middle\">divergent ops</text>",
      14, (f.y(0) + f.y(1)) / 2, 14, (f.y(0) + f.y(1)) / 2);
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\">1e{}</text><text x=\"{}\" y=\"{:.1f}\">"
      "1e{}</text>",
      f.width - f.right + 6, f.y(1) + 4, int(hi), f.width - f.right + 6, f.y(0) + 4, int(lo));
  const double bar = std::max(2.0, f.slot() * 0.6);
  for (size_t i = 0; i < steps.size(); ++i) {
    const double top = f.y(max_count > 0 ? counts[i] / max_count : 0);
    s += fmt::format(
        "<rect class=\"bar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
        "height=\"{:.1f}\" fill=\"{}\"><title>step {}: {} divergent ops</title></rect>",
        f.x(i) - bar / 2, top, bar, f.y(0) - top, kBarColour, steps[i], counts[i]);
  }
  s += log_line(f, rel, lo, hi, 3, [&](size_t i, double x, double y) {
    return fmt::format(
        "<circle class=\"rel\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" "
        "fill=\"{}\"><title>step {}: largest relative difference {}</title>"
        "</circle>",
        x, y, kLineColour, steps[i], html_number(rel[i]));
  });
  s += "</svg>";
  s += fmt::format(
      "<p class=\"muted\"><span style=\"color:{}\">&#9632;</span> divergent ops "
      "(left) &nbsp; <span style=\"color:{}\">&#9679;</span> largest relative "
      "difference of a divergent output, from its statistics (right, log scale; a "
      "step without a point differs below float32 statistics)</p>",
      kBarColour, kLineColour);
  return s;
}

// The step where the numerics changed, op by op from the op that changed them: each divergent
// op's furthest output move (log scale), through the layers of the forward, the backward and
// the optimizer.
std::string layer_growth_plot(const NumericsChange& n) {
  std::vector<uint64_t> ops;
  std::vector<double> rel;
  for (const GrowthPoint& g : n.growth) {
    ops.push_back(g.index);
    rel.push_back(g.relative);
  }
  Frame f;
  f.n = ops.size();
  auto [lo, hi] = log_range(rel);
  std::string s = fmt::format(
      "<svg id=\"layer-growth-plot\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
      "aria-label=\"relative difference of each divergent op of step {}\">",
      f.width, f.height, n.step);
  s += axes(f, ops, "op # in the stream");
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">1e{}</text><text x=\"{}\" "
      "y=\"{:.1f}\" text-anchor=\"end\">1e{}</text>",
      f.left - 6, f.y(1) + 4, int(hi), f.left - 6, f.y(0) + 4, int(lo));
  s += log_line(f, rel, lo, hi, 2, [&](size_t i, double x, double y) {
    return fmt::format(
        "<circle class=\"rel\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" "
        "fill=\"{}\"><title>op #{} {} ({}): {} of its scale</title></circle>",
        x, y, i == 0 ? 6 : 3, kLineColour, ops[i], esc(n.growth[i].op), n.growth[i].phase,
        html_number(rel[i]));
  });
  s += "</svg>";
  s += fmt::format(
      "<p class=\"muted\">Step {}: each divergent op's furthest output move, as a fraction of "
      "its scale (log scale), from {} (the large dot), where the numerics first left the "
      "tolerance, in the order the ops ran{}.</p>",
      n.step, esc(n.op),
      n.growth.size() >= NumericsChange::kMaxGrowth ? " (the first ops only)" : "");
  return s;
}

// The loss of A and B per step, and |A - B| on a log scale: of the rank where the runs part,
// else of the lowest rank.
std::string loss_plot(const DiffReport& r) {
  std::vector<uint64_t> steps;
  std::vector<double> a, b, d;
  auto rank = r.loss.end();
  if (r.first) rank = r.loss.find(r.first->rank);
  if (rank == r.loss.end()) rank = r.loss.begin();
  if (rank != r.loss.end())
    for (const auto& [step, p] : rank->second) {
      steps.push_back(step);
      a.push_back(p.a);
      b.push_back(p.b);
      d.push_back(std::fabs(p.b - p.a));
    }
  if (steps.empty())
    return "<p class=\"muted\">No loss identified (the scalar that backward starts from) in the "
           "steps compared.</p>";
  Frame f;
  f.n = steps.size();
  double lo = 1e300, hi = -1e300;
  for (double v : a) lo = std::min(lo, v), hi = std::max(hi, v);
  for (double v : b) lo = std::min(lo, v), hi = std::max(hi, v);
  if (hi - lo < 1e-12) hi = lo + 1;
  auto frac = [&](double v) { return (v - lo) / (hi - lo); };
  // Not a structured binding: the lambda below captures them, which C++17 (clang) forbids.
  double dlo, dhi;
  std::tie(dlo, dhi) = log_range(d);
  std::string s = fmt::format(
      "<svg id=\"loss-plot\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
      "aria-label=\"loss of run A and run B per step\">",
      f.width, f.height);
  s += axes(f, steps);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#999\"/>",
                   f.width - f.right, f.y(0), f.y(1));
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text><text x=\"{}\" "
      "y=\"{:.1f}\" text-anchor=\"end\">{}</text>",
      f.left - 6, f.y(1) + 4, html_number(hi), f.left - 6, f.y(0) + 4, html_number(lo));
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\">1e{}</text><text x=\"{}\" y=\"{:.1f}\">"
      "1e{}</text>",
      f.width - f.right + 6, f.y(1) + 4, int(dhi), f.width - f.right + 6, f.y(0) + 4, int(dlo));
  auto line = [&](const std::vector<double>& v, const char* cls, const char* colour,
                  const char* dash, bool log) {
    std::string pts, dots;
    for (size_t i = 0; i < v.size(); ++i) {
      if (log && !(v[i] > 0)) continue;
      const double y = f.y(log ? (std::log10(v[i]) - dlo) / (dhi - dlo) : frac(v[i]));
      pts += fmt::format("{:.1f},{:.1f} ", f.x(i), y);
      dots += fmt::format(
          "<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" "
          "fill=\"{}\"><title>step {}: {}</title></circle>",
          cls, f.x(i), y, colour, steps[i], html_number(v[i]));
    }
    if (pts.empty()) return std::string();
    return fmt::format(
        "<polyline class=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"3\" stroke-dasharray=\"{}\"/>{}",
        cls, pts, colour, dash, dots);
  };
  s += line(d, "loss-diff", kLossDiff, "2 3", true);
  s += line(a, "loss-a", kLineColour, "none", false);
  s += line(b, "loss-b", kLossB, "8 5", false);
  s += "</svg>";
  s += fmt::format(
      "<p class=\"muted\">Rank {}: <span style=\"color:{}\">&#9644;</span> loss, run A "
      "&nbsp; <span style=\"color:{}\">&#9644;</span> loss, run B (left) &nbsp; "
      "<span style=\"color:{}\">&#9679;</span> |B - A| (right, log scale; "
      "no point where they are equal)</p>",
      rank->first, kLineColour, kLossB, kLossDiff);
  return s;
}

// One lane per rank, one cell per step, darker with more divergent ops; the first divergence
// is outlined.
std::string rank_lanes(const DiffReport& r) {
  std::map<int64_t, bool> ranks;
  for (const auto& [rank, _] : r.divergent_by_rank) ranks[rank] = true;
  if (r.first) ranks[r.first->rank] = true;
  std::vector<uint64_t> steps;
  for (const auto& [step, _] : r.curve) steps.push_back(step);
  if (ranks.size() < 2 || steps.empty()) return "";
  uint64_t most = 1;
  for (const auto& [_, per] : r.divergent_by_rank)
    for (const auto& [__, n] : per) most = std::max(most, n);
  const double cell = 900.0 / double(steps.size()), lane = 26;
  std::string s = fmt::format(
      "<section><h2>Ranks</h2><svg id=\"rank-lanes\" viewBox=\"0 0 1000 {:.0f}\" "
      "width=\"100%\">",
      lane * double(ranks.size()) + 20);
  size_t row = 0;
  for (const auto& [rank, _] : ranks) {
    const double y = 10 + lane * double(row++);
    s += fmt::format("<text x=\"4\" y=\"{:.0f}\">rank {}</text>", y + 17, rank);
    auto it = r.divergent_by_rank.find(rank);
    for (size_t i = 0; i < steps.size(); ++i) {
      uint64_t n = 0;
      if (it != r.divergent_by_rank.end())
        if (auto jt = it->second.find(steps[i]); jt != it->second.end()) n = jt->second;
      const double alpha = n == 0 ? 0.06 : 0.25 + 0.75 * double(n) / double(most);
      const bool first = r.first && r.first->rank == rank && r.first->step == steps[i];
      s += fmt::format(
          "<rect class=\"lane\" x=\"{:.1f}\" y=\"{:.0f}\" width=\"{:.1f}\" "
          "height=\"{:.0f}\" fill=\"{}\" fill-opacity=\"{:.2f}\" stroke=\"{}\" "
          "stroke-width=\"{}\"><title>rank {} step {}: {} divergent ops</title></rect>",
          80 + cell * double(i), y, cell - 2, lane - 4, kBarColour, alpha, first ? "#000" : "none",
          first ? 3 : 0, rank, steps[i], n);
    }
  }
  s += "</svg><p class=\"muted\">Darker: more divergent ops. Outlined: the first divergence."
       "</p></section>";
  return s;
}

std::string side_cell(const TensorSide& t) {
  if (!t.present) return "<td class=\"muted\">-</td>";
  std::string s = fmt::format("<td><code>{}</code> {} {} {}", esc(short_digest(t.digest)),
                              esc(t.dtype), esc(shape_string(t.sizes)), esc(t.device));
  if (t.uninitialized) s += " <span class=\"muted\">uninitialized</span>";
  if (t.has_stats)
    s += fmt::format("<br><span class=\"muted\">min {} max {} mean {} l2 {}</span>",
                     html_number(t.stats.min), html_number(t.stats.max), html_number(t.stats.mean),
                     html_number(t.stats.l2));
  return s + "</td>";
}

std::string tensor_rows(const std::vector<TensorPair>& pairs) {
  std::string s;
  for (const TensorPair& p : pairs)
    s += fmt::format(
        "<tr><td>{}{}</td><td class=\"{}\">{}</td>{}{}</tr>", esc(p.label()),
        p.a.origin.empty() ? "" : " <span class=\"muted\">(" + esc(p.a.origin) + ")</span>",
        p.differs ? "differs" : "same", p.differs ? "differs" : "same", side_cell(p.a),
        side_cell(p.b));
  return s;
}

std::string first_divergence_card(const FirstDivergence& f) {
  std::string s = "<section id=\"first-divergence\"><h2>First divergence</h2><table>";
  auto row = [&](const char* k, const std::string& v) {
    s += fmt::format("<tr><th>{}</th><td>{}</td></tr>", k, v);
  };
  row("where",
      fmt::format("rank {} ({}), step {}, {} phase{}", f.rank, esc(f.process), f.step, esc(f.phase),
                  f.scope_path.empty() ? "" : ", in <code>" + esc(f.scope_path) + "</code>"));
  row("op", fmt::format("<code>{}</code>", esc(fmt::format("{}", fmt::join(f.chain, " > ")))));
  row("position", fmt::format("op #{} of stream <code>{}</code> (order {} / {})", f.index,
                              esc(f.stream), f.order_a, f.order_b));
  row("class", fmt::format("<span class=\"class\">{}</span> {}",
                           esc(divergence_class_name(f.divergence_class)), esc(f.evidence.detail)));
  if (!f.evidence.confirmed_by.empty()) row("counts", esc(f.evidence.confirmed_by));
  if (!f.evidence.batch_read_by.empty())
    row("batch", "made in this DataLoader worker, read by " + esc(f.evidence.batch_read_by));
  if (!f.evidence.received_through.empty())
    row("received", "through " + esc(f.evidence.received_through));
  for (const std::string& p : spread_lines(f)) row("spread", "propagated through " + esc(p));
  if (!f.evidence.compiled_region.empty())
    row("region", esc(f.evidence.compiled_region) + " (torch.compile, opaque)");
  if (f.evidence.is_random)
    row("rng", fmt::format("<code>{:016x}</code> vs <code>{:016x}</code>", f.evidence.rng_a,
                           f.evidence.rng_b));
  if (!f.explanation.cause.empty()) row("cause", esc(f.explanation.cause));
  row("remedy", esc(f.explanation.remedy));
  if (f.explanation.catalog) {
    const CatalogRef& c = *f.explanation.catalog;
    std::string v = fmt::format("<code>{}</code> ({}): {}", esc(c.id), esc(c.op), esc(c.condition));
    if (!c.conditions_met.empty())
      v += "<br>conditions met: " + esc(fmt::format("{}", fmt::join(c.conditions_met, "; ")));
    if (!c.conditions_unknown.empty())
      v += "<br>not checkable: " + esc(fmt::format("{}", fmt::join(c.conditions_unknown, "; ")));
    v += "<br>remedy: " + esc(c.remedy);
    row("catalog", v);
  }
  s += "</table>";
  if (!f.evidence.inputs.empty() || !f.evidence.outputs.empty()) {
    s += "<h2>Tensors</h2><table><tr><th>tensor</th><th></th><th>run A</th><th>run B</th></tr>";
    s += tensor_rows(f.evidence.inputs);
    s += tensor_rows(f.evidence.outputs);
    s += "</table>";
  }
  if (!f.evidence.magnitude.empty()) {
    s += "<h2>Magnitude (B - A)</h2><table><tr><th>tensor</th><th>min</th><th>max</th>"
         "<th>mean</th><th>l2</th><th>within tolerance</th></tr>";
    for (const StatsDelta& d : f.evidence.magnitude)
      s += d.has_stats
               ? fmt::format(
                     "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                     "<td>{}</td></tr>",
                     esc(d.tensor), html_number(d.min), html_number(d.max), html_number(d.mean),
                     html_number(d.l2), d.within_tolerance ? "yes" : "no")
               : fmt::format(
                     "<tr><td>{}</td><td colspan=\"5\" class=\"muted\">no "
                     "statistics recorded</td></tr>",
                     esc(d.tensor));
    s += "</table>";
  }
  return s + "</section>";
}

}  // namespace

std::string render_html(const DiffReport& r) {
  std::string upper = gate_word(r);
  for (char& c : upper) c = char(std::toupper(uint8_t(c)));
  // The banner's colour is the gate's: a pass is green whatever the verdict's name.
  const bool passes = gate_exit_code(r) == ExitCode::kIdentical;
  std::string b = fmt::format(
      "<div class=\"banner {}\" id=\"verdict\"><strong>{}</strong> {}<small>A: {} &nbsp; B: {}"
      "</small></div><main>",
      passes ? "identical" : verdict_name(r.verdict), esc(upper), esc(one_line_verdict(r)),
      esc(r.run_a), esc(r.run_b));
  if (!r.not_compared.empty()) {
    b += "<section><h2>Not compared</h2><ul>";
    for (const std::string& n : r.not_compared) b += "<li>" + esc(n) + "</li>";
    b += "</ul></section>";
  }
  if (auto [head, lines] = sentinel_lines(r); !head.empty()) {
    b += "<section id=\"sentinel\"><h2>Sentinel</h2><p><strong>" + esc(head) + "</strong></p><ul>";
    for (const std::string& l : lines) b += "<li>" + esc(l) + "</li>";
    b += "</ul></section>";
  }
  for (auto [head, lines] : {selftest_lines(r), validation_lines(r)}) {
    if (head.empty()) continue;
    b += "<section class=\"audit-check\"><h2>Audit check</h2><p><strong>" + esc(head) +
         "</strong></p><ul>";
    for (const std::string& l : lines) b += "<li>" + esc(l) + "</li>";
    b += "</ul></section>";
  }
  if (const auto& v = r.remedy_verification) {
    b += "<section id=\"remedy\"><h2>Remedy verification</h2><p><strong>" + esc(v->outcome) +
         "</strong></p><ul>";
    for (const RemedyVerification::Round& k : v->rounds)
      b += "<li>" +
           esc(fmt::format("round {}: {}: {}{} ({})", k.round, k.flags, k.verdict,
                           k.first.empty() ? "" : ", first at " + k.first, k.runs)) +
           "</li>";
    b += "</ul></section>";
  }
  for (const auto& [head, lines] : ending_lines(r)) {
    b += "<section id=\"endings\"><h2>How the runs ended</h2><p>" + esc(head) + "</p><ul>";
    for (const std::string& l : lines) b += "<li>" + esc(l) + "</li>";
    b += "</ul></section>";
  }
  if (!r.notes.empty()) {
    b += "<section><h2>Notes</h2><ul>";
    for (const std::string& n : r.notes) b += "<li>" + esc(n) + "</li>";
    b += "</ul></section>";
  }
  if (const auto& u = r.first_unread)
    b += fmt::format(
        "<section><h2>Unread differences</h2><p>{} difference(s) overwritten before "
        "any op read them: not divergences. The first: <code>{}</code> (op #{}, "
        "step {}) of <code>{}</code>, overwritten by <code>{}</code>.</p></section>",
        r.unread_differences, esc(u->op), u->index, u->step, esc(u->stream),
        esc(u->overwritten_by));
  if (r.first) b += first_divergence_card(*r.first);
  b += "<section><h2>How the difference grows</h2>" + growth_plot(r) + "</section>";
  if (r.numerics_change && r.numerics_change->growth.size() >= 2)
    b += fmt::format(
        "<section id=\"numerics\"><h2>Through step {}, layer by layer</h2>{}</section>",
        r.numerics_change->step, layer_growth_plot(*r.numerics_change));
  b += "<section><h2>Loss</h2>" + loss_plot(r) + "</section>";
  b += rank_lanes(r);
  for (const ReplicaCheck& c : r.replicas)
    if (c.ranks.size() >= 2)
      b += "<section><h2>Replicas</h2><pre>" + esc(render_replica_check(c)) + "</pre></section>";
  b += "<section><h2>Environment differences</h2>";
  if (r.environment.empty()) {
    b += "<p class=\"muted\">None.</p>";
  } else {
    b += "<table><tr><th>process</th><th>key</th><th>run A</th><th>run B</th></tr>";
    for (const EnvDifference& d : r.environment)
      b += fmt::format("<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                       esc(d.process), esc(d.key), esc(d.a), esc(d.b));
    b += "</table>";
  }
  b += "</section>";
  if (!r.structural.empty()) {
    b += fmt::format(
        "<section><h2>Structural differences ({})</h2><table><tr><th>stream</th>"
        "<th>step</th><th>ops</th><th>detail</th></tr>",
        r.structural_count);
    for (const StructuralDifference& d : r.structural)
      b += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>#{} / #{}</td><td>{}</td></tr>",
                       esc(d.stream), d.step, d.index_a, d.index_b, esc(d.detail));
    b += "</table></section>";
  }
  b += "<section><h2>Streams compared</h2><table><tr><th>stream</th><th>ops A</th><th>ops B</th>"
       "<th>compared</th><th>divergent</th><th>structural</th><th>digest</th><th>notes</th></tr>";
  for (const StreamSummary& s : r.streams) {
    std::string notes;
    if (s.truncated) notes += "truncated ";
    if (s.alignment_lost) notes += "alignment lost ";
    if (!s.in_a || !s.in_b) notes += s.in_a ? "only in A " : "only in B ";
    if (s.consumer_last_step) notes += fmt::format("worker, up to step {} ", *s.consumer_last_step);
    if (!s.compiled_regions.empty())
      notes += s.compiled_kernels + s.compiled_kernels_b
                   ? "torch.compile regions, kernels recorded "
                   : "torch.compile regions (opaque) ";
    b += fmt::format(
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        esc(s.name), s.ops_a, s.ops_b, s.compared, s.divergent, s.structural, esc(s.digest),
        esc(notes));
  }
  b += fmt::format(
      "</table><p class=\"muted\">{} ops compared in {:.2f} s; {} divergent.</p>"
      "</section></main>",
      r.ops_compared, r.seconds, r.divergent_ops);
  return page(fmt::format("detaudit: {}", r.verdict), b);
}

std::string render_risk_html(const RiskReport& r) {
  std::string b = fmt::format(
      "<div class=\"banner {}\" id=\"verdict\"><strong>RISK</strong> {} known nondeterministic "
      "op(s) ran<small>{}: {} ops scanned</small></div><main>",
      r.hits.empty() ? "identical" : "divergent", r.hits.size(), esc(r.run_dir), r.ops_scanned);
  if (!r.hits.empty()) {
    uint64_t most = 1;
    for (const RiskHit& h : r.hits) most = std::max(most, h.count);
    const double row = 28;
    b += fmt::format(
        "<section><h2>Catalog ops that ran</h2><svg id=\"risk-plot\" viewBox=\"0 0 "
        "1000 {:.0f}\" width=\"100%\">",
        row * double(r.hits.size()) + 10);
    for (size_t i = 0; i < r.hits.size(); ++i) {
      const RiskHit& h = r.hits[i];
      const double y = 5 + row * double(i);
      const double w = 560.0 * double(h.count) / double(most);
      b += fmt::format(
          "<text x=\"4\" y=\"{:.0f}\">{}</text><rect class=\"bar\" x=\"300\" "
          "y=\"{:.0f}\" width=\"{:.1f}\" height=\"{:.0f}\" fill=\"{}\"/>"
          "<text x=\"{:.1f}\" y=\"{:.0f}\">x{}</text>",
          y + 17, esc(h.op), y + 3, std::max(2.0, w), row - 8, kBarColour, 306 + w, y + 17,
          h.count);
    }
    b += "</svg><table><tr><th>op</th><th>entry</th><th>times</th><th>first</th>"
         "<th>conditions met</th><th>remedy</th></tr>";
    for (const RiskHit& h : r.hits)
      b += fmt::format(
          "<tr><td><code>{}</code></td><td>{}{}</td><td>{}</td><td>{} step {}</td>"
          "<td>{}{}</td><td>{}</td></tr>",
          esc(h.op), esc(h.entry_id), h.uncertain ? " (uncertain)" : "", h.count, esc(h.stream),
          h.first_step, esc(fmt::format("{}", fmt::join(h.conditions_met, "; "))),
          h.conditions_unknown.empty()
              ? ""
              : "<br><span class=\"muted\">not checkable: " +
                    esc(fmt::format("{}", fmt::join(h.conditions_unknown, "; "))) + "</span>",
          esc(h.remedy));
    b += "</table></section>";
  }
  if (!r.environment.empty()) {
    b += "<section><h2>Environment</h2><table><tr><th>process</th><th>setting</th><th>why</th>"
         "<th>remedy</th></tr>";
    for (const EnvironmentRisk& e : r.environment)
      b += fmt::format("<tr><td>{}</td><td><code>{}={}</code></td><td>{}</td><td>{}</td></tr>",
                       esc(e.process), esc(e.key), esc(e.value), esc(e.why), esc(e.remedy));
    b += "</table></section>";
  }
  for (const std::string& t : r.truncated)
    b += "<section><strong>Truncated:</strong> " + esc(t) + "</section>";
  b += "</main>";
  return page("detaudit: risk report", b);
}

}  // namespace detaudit
