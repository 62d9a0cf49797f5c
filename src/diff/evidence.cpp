// The evidence a classification reads: where each tensor's contents came from, the op's tensors
// side by side, and how far their statistics moved.
#include "diff/evidence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace detaudit {

using trace::TensorDesc;

namespace {

// The scales a statistic's difference is measured against: the tensor's largest magnitude for
// min and max, its root mean square for the mean (a gradient's mean near zero is no scale), its
// norm for L2. Run A's tensor sets them.
struct StatScales {
  double min_max = 0, mean = 0, l2 = 0;
};

StatScales scales_of(const TensorDesc& a) {
  uint64_t n = 1;
  for (int64_t d : a.sizes) n *= uint64_t(std::max<int64_t>(d, 0));
  StatScales s;
  s.min_max = std::max(std::fabs(a.stats.min), std::fabs(a.stats.max));
  s.mean = std::max(std::fabs(a.stats.mean), n ? std::fabs(a.stats.l2) / std::sqrt(double(n)) : 0);
  s.l2 = std::fabs(a.stats.l2);
  return s;
}

// One statistic within the gate: |b - a| <= atol + (rtol + ulp * epsilon) * scale.
bool within(double a, double b, double scale, double epsilon, const GateConfig& g) {
  if (std::isnan(a) && std::isnan(b)) return true;
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(b - a) <= g.atol + (g.rtol + g.ulp * epsilon) * scale;
}

StatsDelta delta_of(const TensorDesc& a, const TensorDesc& b, const GateConfig& g,
                    std::string name) {
  StatsDelta d;
  d.tensor = std::move(name);
  d.has_stats = a.has_stats() && b.has_stats();
  d.nan = int64_t(b.stats.nan) - int64_t(a.stats.nan);
  d.inf = int64_t(b.stats.inf) - int64_t(a.stats.inf);
  if (!d.has_stats) return d;  // no statistics: never within tolerance
  d.min = b.stats.min - a.stats.min;
  d.max = b.stats.max - a.stats.max;
  d.mean = b.stats.mean - a.stats.mean;
  d.l2 = b.stats.l2 - a.stats.l2;
  for (double v : {d.min, d.max, d.mean, d.l2})
    if (std::isfinite(v)) d.max_abs = std::max(d.max_abs, std::fabs(v));
  const StatScales sc = scales_of(a);
  const double eps = dtype_epsilon(a.dtype);
  const std::pair<double, double> scaled[] = {
      {d.min, sc.min_max}, {d.max, sc.min_max}, {d.mean, sc.mean}, {d.l2, sc.l2}};
  for (const auto& [delta, scale] : scaled) {
    if (!std::isfinite(delta) || delta == 0) continue;
    d.relative = std::max(d.relative, scale > 0 && std::isfinite(scale)
                                          ? std::fabs(delta) / scale
                                          : std::numeric_limits<double>::infinity());
  }
  d.ulps = eps > 0 ? d.relative / eps : -1;
  d.within_tolerance = d.nan == 0 && d.inf == 0 &&
                       within(a.stats.min, b.stats.min, sc.min_max, eps, g) &&
                       within(a.stats.max, b.stats.max, sc.min_max, eps, g) &&
                       within(a.stats.mean, b.stats.mean, sc.mean, eps, g) &&
                       within(a.stats.l2, b.stats.l2, sc.l2, eps, g);
  return d;
}

bool digests_differ(const TensorDesc* a, const TensorDesc* b) {
  // An argument the op overwrote without reading has no contents to compare.
  return a && b && !a->not_read() && !b->not_read() && !a->same_digest(*b);
}

}  // namespace

// Where a tensor's contents came from, following view bases inside the stream's window.
std::string origin_of(const TensorDesc* t, const trace::TraceReader& r, bool* external,
                      bool* uninitialized, bool* compiled) {
  *external = *uninitialized = false;
  if (compiled) *compiled = false;
  if (t && t->not_read()) return "not read: the op overwrites it";
  for (int hops = 0; t && hops < 64; ++hops) {
    if (t->uninitialized()) {
      *uninitialized = true;
      return hops ? "view of an uninitialized tensor (empty family)"
                  : "uninitialized (empty family)";
    }
    if (t->provenance() == trace::Provenance::kExternal) {
      *external = true;
      return hops ? "view of an external tensor" : "external";
    }
    if (t->provenance() == trace::Provenance::kCompiled) {
      if (compiled) *compiled = true;
      return hops ? "view of a compiled region's output (unrecorded kernels)"
                  : "a compiled region's output (unrecorded kernels)";
    }
    if (t->provenance() != trace::Provenance::kView) return "output of an earlier op";
    t = r.tensor(t->base_id);
  }
  return "unknown (left the reference window)";
}

TensorSide side_of(const TensorDesc* t, const trace::TraceReader& r) {
  TensorSide s;
  if (!t) return s;
  s.present = true;
  s.digest = t->digest_hex();
  s.sizes = t->sizes.to_vector();
  if (!(t->bits & trace::kTensorContiguous)) s.strides = t->strides.to_vector();
  s.dtype = std::string(trace::dtype_name(t->dtype));
  s.device = std::string(trace::device_type_name(t->device_type));
  if (t->device_index >= 0) s.device += ":" + std::to_string(t->device_index);
  s.provenance = std::string(trace::provenance_name(t->provenance()));
  s.uninitialized = t->uninitialized();
  s.has_stats = t->has_stats();
  s.stats = t->stats;
  bool ext, uninit;
  s.origin = origin_of(t, r, &ext, &uninit);
  s.in_shared_memory = t->sharing != trace::Sharing::kNone;
  return s;
}

bool outputs_differ(const trace::OpRecord& a, const trace::TraceReader& ra,
                    const trace::OpRecord& b, const trace::TraceReader& rb) {
  if (a.results_hash != b.results_hash) return true;  // a scalar return (item()) differs
  size_t n = std::min(a.output_tensors.size(), b.output_tensors.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorDesc* ta = ra.tensor(a.output_tensors[i]);
    const TensorDesc* tb = rb.tensor(b.output_tensors[i]);
    if (!ta || !tb || !ta->has_contents() || !tb->has_contents()) continue;
    if (!ta->same_digest(*tb)) return true;
  }
  return false;
}

namespace {

bool close_sum(double x, double y, double scale) {
  return std::abs(x - y) <= 1e-9 * std::max(scale, std::numeric_limits<double>::min());
}

bool same_values_in_another_order(const TensorDesc& a, const TensorDesc& b) {
  if (!a.has_stats() || !b.has_stats() || a.dtype != b.dtype || a.numel() != b.numel())
    return false;
  const trace::TensorStats &x = a.stats, &y = b.stats;
  const double largest = std::max(std::abs(x.min), std::abs(x.max));
  return x.min == y.min && x.max == y.max && x.nan == y.nan && x.inf == y.inf &&
         close_sum(x.mean, y.mean, largest) && close_sum(x.l2, y.l2, x.l2);
}

}  // namespace

bool outputs_reordered(const trace::OpRecord& a, const trace::TraceReader& ra,
                       const trace::OpRecord& b, const trace::TraceReader& rb, size_t* first) {
  if (a.results_hash != b.results_hash) return false;
  bool any = false;
  size_t n = std::min(a.output_tensors.size(), b.output_tensors.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorDesc* ta = ra.tensor(a.output_tensors[i]);
    const TensorDesc* tb = rb.tensor(b.output_tensors[i]);
    if (!ta || !tb || !ta->has_contents() || !tb->has_contents() || ta->same_digest(*tb)) continue;
    if (!same_values_in_another_order(*ta, *tb)) return false;
    if (!any) *first = i;
    any = true;
  }
  return any;
}

bool output_deltas(const trace::OpRecord& a, const trace::TraceReader& ra, const trace::OpRecord& b,
                   const trace::TraceReader& rb, const GateConfig& gate,
                   std::vector<StatsDelta>* out) {
  bool all_within = true;
  size_t n = std::min(a.output_tensors.size(), b.output_tensors.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorDesc* ta = ra.tensor(a.output_tensors[i]);
    const TensorDesc* tb = rb.tensor(b.output_tensors[i]);
    if (!ta || !tb || !ta->has_contents() || !tb->has_contents() || ta->same_digest(*tb)) continue;
    const std::string written = trace::written_argument(a, ra, i);
    StatsDelta d = delta_of(*ta, *tb, gate,
                            written.empty() ? fmt::format("output {}", i) : "written " + written);
    all_within = all_within && d.within_tolerance;
    if (out) out->push_back(std::move(d));
  }
  return all_within;
}

double dtype_epsilon(trace::Dtype dtype) {
  switch (dtype) {
    case trace::Dtype::kFloat16:
    case trace::Dtype::kComplex32: return 0x1p-10;
    case trace::Dtype::kBFloat16: return 0x1p-7;
    case trace::Dtype::kFloat32:
    case trace::Dtype::kComplex64: return 0x1p-23;
    case trace::Dtype::kFloat64:
    case trace::Dtype::kComplex128: return 0x1p-52;
    default: return 0;
  }
}

double largest_relative_difference(const trace::OpRecord& a, const trace::TraceReader& ra,
                                   const trace::OpRecord& b, const trace::TraceReader& rb) {
  return tensors_deviation(a.output_tensors, ra, b.output_tensors, rb, GateConfig{}).relative;
}

StatsDelta stats_delta(const TensorDesc& a, const TensorDesc& b, const GateConfig& gate) {
  return delta_of(a, b, gate, "");
}

Deviation tensors_deviation(const std::vector<int64_t>& ids_a, const trace::TraceReader& ra,
                            const std::vector<int64_t>& ids_b, const trace::TraceReader& rb,
                            const GateConfig& gate, const char* role) {
  Deviation dev;
  const size_t n = std::min(ids_a.size(), ids_b.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorDesc* ta = ra.tensor(ids_a[i]);
    const TensorDesc* tb = rb.tensor(ids_b[i]);
    if (!ta || !tb || !ta->has_contents() || !tb->has_contents() || ta->not_read() ||
        tb->not_read() || ta->same_digest(*tb))
      continue;
    const StatsDelta d = delta_of(*ta, *tb, gate, "");
    dev.within = dev.within && d.within_tolerance;
    if (!d.has_stats) continue;
    if (dev.tensor.empty() || d.relative > dev.relative) {
      dev.relative = d.relative;
      dev.ulps = d.ulps;
      dev.tensor = fmt::format("{} {}", role, i);
      dev.dtype = std::string(trace::dtype_name(ta->dtype));
    }
  }
  return dev;
}

// The op's tensors side by side into fd->inputs and fd->outputs; the first differing input
// (which decides between the input classes), or -1.
int pair_tensors(const BufferedOp& a, const OpSource& sa, const BufferedOp& b, const OpSource& sb,
                 FirstDivergence* fd) {
  const trace::TraceReader& ra = sa.reader();
  const trace::TraceReader& rb = sb.reader();
  const trace::OpRecord& oa = a.rec;
  const trace::OpRecord& ob = b.rec;
  int first_diff_input = -1;
  for (size_t i = 0; i < std::max(oa.input_tensors.size(), ob.input_tensors.size()); ++i) {
    const TensorDesc* ta = i < oa.input_tensors.size() ? ra.tensor(oa.input_tensors[i]) : nullptr;
    const TensorDesc* tb = i < ob.input_tensors.size() ? rb.tensor(ob.input_tensors[i]) : nullptr;
    // An input the op overwrites without reading: its old bytes reach nothing.
    const bool written = oa.input_written(i) || ob.input_written(i);
    TensorPair p{"input",         int(i),          !written && digests_differ(ta, tb),
                 side_of(ta, ra), side_of(tb, rb), ""};
    if (written) p.a.origin = p.b.origin = "not read: the op overwrites it";
    if (p.differs && first_diff_input < 0) first_diff_input = int(i);
    fd->evidence.inputs.push_back(std::move(p));
  }
  for (size_t i = 0; i < std::max(oa.output_tensors.size(), ob.output_tensors.size()); ++i) {
    const TensorDesc* ta = i < oa.output_tensors.size() ? ra.tensor(oa.output_tensors[i]) : nullptr;
    const TensorDesc* tb = i < ob.output_tensors.size() ? rb.tensor(ob.output_tensors[i]) : nullptr;
    bool differs = digests_differ(ta, tb) && !ta->uninitialized() && !tb->uninitialized();
    TensorPair p{"output", int(i), differs, side_of(ta, ra), side_of(tb, rb), ""};
    p.written_argument = trace::written_argument(i < oa.output_tensors.size() ? oa : ob,
                                                 i < oa.output_tensors.size() ? ra : rb, i);
    // An output's origin is the op itself; only say so when it is not plain.
    for (TensorSide* side : {&p.a, &p.b})
      if (side->origin == "output of an earlier op") side->origin.clear();
    fd->evidence.outputs.push_back(std::move(p));
  }
  return first_diff_input;
}

std::string kernel_origin(const trace::OpRecord& op, const trace::TraceReader& r) {
  if (!trace::is_compiled_kernel(r.string(op.name))) return "";
  for (const trace::Value& v : op.inputs)
    if (v.type == trace::ValueType::kString) return std::string(r.string(uint64_t(v.i)));
  return "";
}

bool on_cpu(const FirstDivergence& fd) {
  for (const auto* v : {&fd.evidence.outputs, &fd.evidence.inputs})
    for (const TensorPair& p : *v)
      if (p.a.present && p.a.device.rfind("cpu", 0) != 0) return false;
  return true;
}

}  // namespace detaudit
