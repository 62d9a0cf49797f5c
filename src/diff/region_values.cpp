#include "diff/region_values.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "diff/aligner.h"
#include "diff/classify.h"

namespace detaudit {
namespace {

struct Value {
  const trace::TensorDesc* tensor;
  std::string_view made_by;  // the outermost op that returned these bytes
  uint32_t depth;
};

// The same elements, in any shape: autograd hands a bias's gradient on as sum's [1, n] in one
// run and as a view [n] of it, read by AccumulateGrad, in the other.
bool same_elements(const trace::TensorDesc& x, const trace::TensorDesc& y) {
  return x.numel() == y.numel();
}

bool same_geometry(const trace::TensorDesc& x, const trace::TensorDesc& y) {
  return x.dtype == y.dtype && same_elements(x, y);
}

bool same_bits(const trace::TensorDesc& x, const trace::TensorDesc& y) {
  return same_geometry(x, y) && x.digest_len > 0 && x.same_digest(y);
}

bool floating(trace::Dtype d) { return dtype_epsilon(d) > 0; }

// A counterpart to compare by statistics: the same elements, and the same dtype or both floating
// (a layer computed in float64 and cast back holds its float32 values in float64).
bool comparable(const trace::TensorDesc& x, const trace::TensorDesc& y) {
  return same_elements(x, y) && (x.dtype == y.dtype || (floating(x.dtype) && floating(y.dtype)));
}

uint64_t bits_key(const trace::TensorDesc& t) {
  uint64_t k = 0;
  std::memcpy(&k, t.digest.data(), std::min<size_t>(sizeof k, t.digest_len));
  return k;
}

// The values one side's region made, each once, found by their bits in constant time: a
// region's values are looked up once for each input of every op after it in the buffer.
struct Made {
  std::vector<Value> values;
  std::unordered_multimap<uint64_t, size_t> by_digest;
  // The first tensor id the region described: one described before it holds no value of its,
  // whatever its bytes (a 0.0 the program made earlier, read after the region).
  int64_t first_id = std::numeric_limits<int64_t>::max();
  std::unordered_set<int64_t> ids;  // of the tensors its ops returned

  // The index of the value with these bits, or -1.
  int64_t find(const trace::TensorDesc& t) const {
    if (t.digest_len == 0) return -1;
    auto [first, last] = by_digest.equal_range(bits_key(t));
    for (auto it = first; it != last; ++it)
      if (same_bits(*values[it->second].tensor, t)) return int64_t(it->second);
    return -1;
  }
};

// Bytes an op copied from an input that entered the program (torch.compile's clone of the
// generator's state): data from outside, not a value the region computed.
bool copied_from_outside(const trace::TraceReader& r, const trace::OpRecord& op,
                         const trace::TensorDesc& out) {
  for (int64_t id : op.input_tensors) {
    const trace::TensorDesc* in = r.tensor(id);
    if (in && in->provenance() == trace::Provenance::kExternal && same_bits(*in, out)) return true;
  }
  return false;
}

// The values side s's first n ops made.
Made made_in(const OpSource& s, size_t n) {
  const trace::TraceReader& r = s.reader();
  Made made;
  for (size_t k = 0; k < n; ++k) {
    const trace::OpRecord& op = s.at(k).rec;
    for (int64_t id : op.output_tensors) {
      const trace::TensorDesc* t = r.tensor(id);
      if (!t || !t->has_contents() || t->digest_len == 0) continue;
      made.first_id = std::min(made.first_id, id);
      made.ids.insert(id);
      if (copied_from_outside(r, op, *t)) continue;
      const int64_t again = made.find(*t);
      if (again < 0) {
        made.by_digest.emplace(bits_key(*t), made.values.size());
        made.values.push_back({t, s.name_of(op), op.depth});
      } else if (op.depth < made.values[size_t(again)].depth) {
        // An enclosing op ends after its inner ones: name the outermost.
        made.values[size_t(again)].made_by = s.name_of(op);
        made.values[size_t(again)].depth = op.depth;
      }
    }
  }
  return made;
}

// Of those, the ones an op after them (in the buffer) reads: by digest, a read of the same
// bytes under another tensor id (a view, a re-described tensor) included, until an op makes
// the same bytes again (the next step's zeros are not this region's). Once an op of another
// phase ran, only the tensors the region returned and views of them: the same bytes first seen
// later are other data (Trainer's 0.0 its loss is summed into). A forward value first read by
// the backward or the optimizer was saved for the gradient: the region's state
// (native_layer_norm's rstd where the one by hand keeps sqrt(var + eps), a compiled forward's
// buffers), compared through the gradients the backward's region hands on, not here.
std::vector<Value> handed_on(const OpSource& s, size_t n, const Made& made) {
  const trace::TraceReader& r = s.reader();
  const trace::Phase phase = n > 0 ? s.at(0).rec.phase : trace::Phase::kOther;
  bool phase_left = false;
  std::vector<Value> out;
  std::vector<char> settled(made.values.size(), 0);
  size_t open = made.values.size();
  auto take = [&](const std::vector<int64_t>& ids, bool read) {
    for (int64_t id : ids) {
      const trace::TensorDesc* t = r.tensor(id);
      if (!t || !t->has_contents() || id < made.first_id) continue;
      int64_t i = made.find(*t);
      const bool view = t->provenance() == trace::Provenance::kView;
      // A view of a value read in another layout (a transpose's, which no op records): its
      // base is what the region handed on.
      if (i < 0 && read && view)
        if (const trace::TensorDesc* base = r.tensor(t->base_id); base && base->has_contents())
          i = made.find(*base);
      if (i < 0 || settled[size_t(i)]) continue;
      if (read && phase_left && !view && !made.ids.count(id)) continue;
      if (read) out.push_back(made.values[size_t(i)]);
      settled[size_t(i)] = 1;
      --open;
    }
  };
  for (size_t k = n; k < s.size() && open > 0; ++k) {
    const trace::OpRecord& op = s.at(k).rec;
    phase_left = phase_left || op.phase != phase;
    const bool saved = phase == trace::Phase::kForward && (op.phase == trace::Phase::kBackward ||
                                                           op.phase == trace::Phase::kOptimizer);
    take(op.input_tensors, /*read=*/!saved);
    take(op.output_tensors, /*read=*/false);
  }
  return out;
}

// Each value one side hands on against every value the other side's region made (its own
// handed-on values may differ: autograd saves other tensors for other ops), counted into *rv;
// `from_a`: `from` is run A's.
void match(const std::vector<Value>& from, const Made& to, bool from_a, const GateConfig& gate,
           RegionValues* rv, bool* furthest_beyond) {
  for (const Value& v : from) {
    ++rv->handed_on;
    if (to.find(*v.tensor) >= 0) {
      ++rv->exact;
      continue;
    }
    const Value* nearest = nullptr;
    StatsDelta best;
    for (const Value& w : to.values) {
      if (!comparable(*v.tensor, *w.tensor)) continue;
      // Measured against run A's value, as every other difference is.
      StatsDelta d = from_a ? stats_delta(*v.tensor, *w.tensor, gate)
                            : stats_delta(*w.tensor, *v.tensor, gate);
      if (!d.has_stats) d.relative = std::numeric_limits<double>::infinity();
      if (!nearest || d.relative < best.relative) {
        nearest = &w;
        best = d;
      }
    }
    if (!nearest) {
      ++rv->unmatched;
      continue;
    }
    const bool beyond = !best.within_tolerance;
    ++(beyond ? rv->beyond : rv->within);
    // The furthest beyond the tolerance, or within it while none is beyond.
    if ((beyond && !*furthest_beyond) ||
        (beyond == *furthest_beyond && best.relative > rv->relative)) {
      *furthest_beyond = beyond;
      rv->relative = best.relative;
      rv->ulps = best.ulps;
      rv->dtype = std::string(trace::dtype_name(v.tensor->dtype));
      rv->op_a = std::string(from_a ? v.made_by : nearest->made_by);
      rv->op_b = std::string(from_a ? nearest->made_by : v.made_by);
    }
  }
}

}  // namespace

RegionValues match_region_values(const OpSource& a, size_t n, const OpSource& b, size_t m,
                                 const GateConfig& gate) {
  const Made made_a = made_in(a, n);
  const Made made_b = made_in(b, m);
  RegionValues rv;
  rv.made = made_a.values.size() + made_b.values.size();
  bool furthest_beyond = false;
  match(handed_on(a, n, made_a), made_b, /*from_a=*/true, gate, &rv, &furthest_beyond);
  match(handed_on(b, m, made_b), made_a, /*from_a=*/false, gate, &rv, &furthest_beyond);
  return rv;
}

MatchedRegion match_region(const OpSource& a, size_t n, const OpSource& b, size_t m,
                           const GateConfig& gate) {
  MatchedRegion region{n, m, match_region_values(a, n, b, m, gate), 1};
  if (region.values.unmatched == 0 && region.values.beyond == 0) return region;
  const trace::OpRecord& first = a.at(0).rec;
  auto in_region = [&](const OpSource& s, size_t k) {
    return k < s.size() && s.at(k).rec.step == first.step && s.at(k).rec.phase == first.phase;
  };
  auto both_ran = [&](size_t i, size_t j) {
    return in_region(a, i) && in_region(b, j) && a.at(i).key == b.at(j).key;
  };
  // Every value with a counterpart within the tolerance: the region is found. Short of that, a
  // wider region only offers more values to pair by chance.
  auto found = [&](size_t i, size_t j, size_t stretches) -> std::optional<MatchedRegion> {
    RegionValues values = match_region_values(a, i, b, j, gate);
    if (values.handed_on > 0 && values.unmatched == 0 && values.beyond == 0)
      return MatchedRegion{i, j, std::move(values), stretches};
    return std::nullopt;
  };
  // Autograd sums a refactor's gradient contributions in another order: in the backward the
  // ops both ran after a stretch join it one by one, as only the last of the adds holds the same
  // sum. Not in the forward, where it would take in a value that left the tolerance.
  const bool backward = first.phase == trace::Phase::kBackward;
  size_t i = n, j = m;
  for (size_t stretches = 1; stretches <= kMaxWidenedStretches; ++stretches) {
    if (stretches > 1) {
      // Over the ops both ran, to the next that differ: they join the region.
      while (both_ran(i, j)) ++i, ++j;
      if (!in_region(a, i) || !in_region(b, j)) break;
      const auto next = find_resync(a, b, i, j);
      if (!next || next->first > kMaxMatchedRegion || next->second > kMaxMatchedRegion) break;
      std::tie(i, j) = *next;
      if (auto r = found(i, j, stretches)) return *r;
    }
    for (size_t t = 0; backward && t < kMaxAbsorbedOps && both_ran(i + t, j + t); ++t)
      if (auto r = found(i + t + 1, j + t + 1, stretches)) return *r;
  }
  return region;
}

uint64_t values_read_after(const OpSource& s, size_t n) {
  return handed_on(s, n, made_in(s, n)).size();
}

std::string region_values_text(const RegionValues& v) {
  if (v.made == 0)
    return "its ops return no value (autograd's nodes for views): the ops after it decide";
  if (v.handed_on == 0) return "no value its ops made is read after it";
  const uint64_t paired = v.handed_on - v.unmatched;
  std::string out;
  if (v.same_bits())
    out = fmt::format("the {} value(s) it hands on agree bit for bit", v.handed_on);
  else if (v.matched())
    out = fmt::format(
        "the {} value(s) it hands on with a counterpart agree within the tolerance ({} bit for "
        "bit; the furthest {:.2g} of its scale)",
        paired, v.exact, v.relative);
  else
    out = fmt::format(
        "of the {} value(s) it hands on with a counterpart, {} agree bit for bit, {} "
        "within the tolerance",
        paired, v.exact, v.within);
  if (v.beyond)
    out += fmt::format(
        "; {} beyond it, the furthest {}'s in run A against {}'s in run B ({:.2g} of "
        "its scale{})",
        v.beyond, v.op_a, v.op_b, v.relative,
        v.ulps >= 0 ? fmt::format(", {:.3g} ulp of {}", v.ulps, v.dtype) : "");
  if (v.unmatched)
    out += fmt::format("; {} more with no value of its shape in the other run's region",
                       v.unmatched);
  return out;
}

}  // namespace detaudit
