// Divergence classes, side-by-side tensors, magnitudes and causes.
#include "diff/classify.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace detaudit {
namespace {

using trace::TensorDesc;

// Where a tensor's contents came from, following view bases inside the stream's window.
std::string origin_of(const TensorDesc* t, const trace::TraceReader& r, bool* external,
                      bool* uninitialized, bool* compiled = nullptr) {
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

// t's bytes (its own, or its base's through views) changed in shared memory, by another process.
bool changed_elsewhere(const TensorDesc* t, const trace::TraceReader& r) {
  for (int hops = 0; t && hops < 64; ++hops) {
    if (t->sharing == trace::Sharing::kChangedElsewhere) return true;
    if (t->provenance() != trace::Provenance::kView) return false;
    t = r.tensor(t->base_id);
  }
  return false;
}

// The tensor a view's bytes belong to, if t is a view and its base is still in the window.
const TensorDesc* viewed_base(const TensorDesc* t, const trace::TraceReader& r) {
  if (!t || t->provenance() != trace::Provenance::kView) return nullptr;
  for (int hops = 0; t && hops < 64 && t->provenance() == trace::Provenance::kView; ++hops)
    t = r.tensor(t->base_id);
  return t && t->has_contents() ? t : nullptr;
}

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

// The state of a CPU generator as torch.get_rng_state() returns it: mt19937's, as uint8[5056].
bool is_cpu_generator_state(const TensorDesc* t) {
  return t && trace::dtype_name(t->dtype) == "uint8" && t->sizes.size() == 1 && t->sizes[0] == 5056;
}

// Ops whose outputs hold exactly the values of their first input (aliases and copies).
bool passes_values_through(std::string_view op) {
  static const char* kOps[] = {"aten::detach_",    "aten::detach",          "detach_",
                               "detach",           "aten::alias",           "aten::lift",
                               "aten::lift_fresh", "aten::lift_fresh_copy", "aten::clone",
                               "aten::contiguous", "aten::_to_copy",        "aten::to"};
  for (const char* k : kOps)
    if (op == k) return true;
  return false;
}

// True when an input recorded as the uninitialized output of the empty family was written
// before this op by something the recorder does not see (torch.tensor(list) fills an
// at::empty buffer with Python data, a numpy copy, a memcpy): the op passes its input's values
// through, yet its output's digest is not the input's.
bool filled_outside_recorded_ops(const trace::OpRecord& op, std::string_view name,
                                 const trace::TraceReader& r, size_t input) {
  if (!passes_values_through(name) || input >= op.input_tensors.size()) return false;
  const TensorDesc* in = r.tensor(op.input_tensors[input]);
  if (!in || !in->uninitialized()) return false;
  for (int64_t id : op.output_tensors) {
    const TensorDesc* out = r.tensor(id);
    if (out && !out->uninitialized() && out->dtype == in->dtype && out->sizes == in->sizes &&
        !out->same_digest(*in))
      return true;
  }
  return false;
}

bool is_tensor_value(const trace::Value& v) { return trace::is_tensor(v.type); }

std::string value_text(const trace::Value& v, const trace::TraceReader& r) {
  switch (v.type) {
    case trace::ValueType::kInt: return fmt::format("{}", v.i);
    case trace::ValueType::kDouble: return fmt::format("{:.17g}", v.d);
    case trace::ValueType::kBoolTrue: return "True";
    case trace::ValueType::kBoolFalse: return "False";
    case trace::ValueType::kNone: return "None";
    case trace::ValueType::kString: return fmt::format("'{}'", r.string(uint64_t(v.i)));
    default: return fmt::format("({} values)", v.count);
  }
}

// The first non-tensor value (argument or return, flattened) that differs: "0.5 vs 0.25".
std::string first_differing_value(const std::vector<trace::Value>& a, const trace::TraceReader& ra,
                                  const std::vector<trace::Value>& b,
                                  const trace::TraceReader& rb) {
  size_t i = 0, j = 0;
  for (;;) {
    while (i < a.size() && is_tensor_value(a[i])) ++i;
    while (j < b.size() && is_tensor_value(b[j])) ++j;
    if (i >= a.size() || j >= b.size()) return "";
    std::string x = value_text(a[i], ra), y = value_text(b[j], rb);
    if (a[i].type == trace::ValueType::kGenerator) x = y;  // compared as RNG state
    if (x != y) return x + " vs " + y;
    ++i, ++j;
  }
}

}  // namespace

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

namespace {

// Where each run's bytes were made: "; run A read what aten::uniform_ made at op #15, run B what
// aten::uniform_ made at op #23" ("" when either is unknown). Both runs made both: the values
// agree, drawn at the same places; which tensor got them differs.
std::string made_where(const SeenOutputs& seen, const trace::DigestBytes& read_in_a,
                       const trace::DigestBytes& read_in_b, const OpSource& sa,
                       const OpSource& sb) {
  const SeenOutputs::Made* in_a = SeenOutputs::find(seen.a, read_in_a);
  const SeenOutputs::Made* in_b = SeenOutputs::find(seen.b, read_in_b);
  if (!in_a || !in_b) return "";
  return fmt::format("; run A read what {} made at op #{}, run B what {} made at op #{}",
                     sa.reader().string(in_a->name), in_a->index, sb.reader().string(in_b->name),
                     in_b->index);
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
    fd->inputs.push_back(std::move(p));
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
    fd->outputs.push_back(std::move(p));
  }
  return first_diff_input;
}

// The differing input is, in both runs, an earlier op's output both made (or a view of one),
// but a different one: the same tensors in another selection or order. True when classified.
bool classify_data_order(const TensorDesc* ta, const OpSource& sa, const TensorDesc* tb,
                         const OpSource& sb, const SeenOutputs& seen, int input,
                         FirstDivergence* fd) {
  if (ta && tb && SeenOutputs::has(seen.b, ta->digest) && SeenOutputs::has(seen.a, tb->digest)) {
    // Each run's tensor is one the other run made too: a Python shuffle of samples, an
    // unseeded sampler.
    fd->divergence_class = DivergenceClass::kExternalInput;
    fd->data_order = true;
    fd->detail = fmt::format(
        "input {} is, in both runs, an earlier op's output that agreed, but a different one: "
        "the same tensors in a different selection or order{}",
        input, made_where(seen, ta->digest, tb->digest, sa, sb));
    return true;
  }
  // The same through views (addmm's expanded bias): each view's base is an output the other
  // run made too, so the tensors were created or picked in another order.
  const TensorDesc* base_a = viewed_base(ta, sa.reader());
  const TensorDesc* base_b = viewed_base(tb, sb.reader());
  if (!base_a || !base_b || base_a->same_digest(*base_b) ||
      !SeenOutputs::has(seen.b, base_a->digest) || !SeenOutputs::has(seen.a, base_b->digest))
    return false;
  fd->divergence_class = DivergenceClass::kExternalInput;
  fd->data_order = true;
  fd->data_order_through_view = true;
  fd->detail = fmt::format(
      "input {} is, in both runs, a view of an earlier op's output that agreed, but of a "
      "different one: the same tensors, created or picked in a different order{}",
      input, made_where(seen, base_a->digest, base_b->digest, sa, sb));
  return true;
}

// Input `first_diff_input` differs: where it came from decides the class.
void classify_differing_input(const BufferedOp& a, const OpSource& sa, const BufferedOp& b,
                              const OpSource& sb, int first_diff_input, const SeenOutputs* seen,
                              FirstDivergence* fd) {
  const trace::TraceReader& ra = sa.reader();
  const trace::TraceReader& rb = sb.reader();
  const trace::OpRecord& oa = a.rec;
  const trace::OpRecord& ob = b.rec;
  const size_t in = size_t(first_diff_input);
  const TensorDesc* ta = ra.tensor(oa.input_tensors[in]);
  const TensorDesc* tb = in < ob.input_tensors.size() ? rb.tensor(ob.input_tensors[in]) : nullptr;
  bool ext = false, uninit = false, compiled = false;
  std::string origin = origin_of(ta, ra, &ext, &uninit, &compiled);
  if ((ext || compiled) && is_cpu_generator_state(ta)) {
    // torch.compile saves and restores the RNG around tracing; users save it too.
    fd->divergence_class = DivergenceClass::kRngState;
    fd->detail = fmt::format(
        "input {} is a CPU generator's state (torch.get_rng_state(), 5056 bytes): the "
        "generator was seeded or consumed differently before this op",
        first_diff_input);
    return;
  }
  if (compiled && !fd->compiled_region.empty()) {
    // The region's own recorded inputs matched (it would have diverged first otherwise): the
    // difference arose inside it, in kernels the dispatcher never sees.
    fd->divergence_class = DivergenceClass::kNondeterministicOp;
    fd->arose_in_compiled_region = true;
    fd->detail = fmt::format(
        "input {} was made inside the compiled region {}, whose recorded inputs matched: the "
        "difference arose in its kernels, which run below the dispatcher and are not recorded",
        first_diff_input, fd->compiled_region);
    return;
  }
  if (changed_elsewhere(ta, ra) || changed_elsewhere(tb, rb)) {
    fd->divergence_class = DivergenceClass::kSharedMemory;
    fd->detail = fmt::format(
        "input {} is in shared memory and changed since this process last read or wrote it, "
        "with no write of its own: another process wrote it",
        first_diff_input);
    return;
  }
  if (!uninit) {  // either side: an uninitialized buffer in run B explains it too
    bool ext_b = false;
    std::string origin_b = origin_of(tb, rb, &ext_b, &uninit);
    if (uninit) origin = origin_b;
  }
  if (uninit && (filled_outside_recorded_ops(oa, fd->op, ra, in) ||
                 filled_outside_recorded_ops(ob, sb.name_of(ob), rb, in))) {
    fd->divergence_class = DivergenceClass::kExternalInput;
    fd->detail = fmt::format(
        "input {} is an empty-family buffer filled outside the recorded ops (e.g. "
        "torch.tensor from Python data, a numpy copy), and what was written differs",
        first_diff_input);
    return;
  }
  if (!uninit && !ext && seen && classify_data_order(ta, sa, tb, sb, *seen, first_diff_input, fd))
    return;
  if (uninit) {
    fd->divergence_class = DivergenceClass::kUninitializedMemory;
  } else if (ext) {
    fd->divergence_class = DivergenceClass::kExternalInput;
    // A 0-dim external tensor is how a Python number reaches an op (a wrapped scalar).
    if (ta && tb && ta->sizes.empty() && tb->sizes.empty() && ta->has_stats() && tb->has_stats())
      fd->scalar_argument = fmt::format("{:.17g} vs {:.17g}", ta->stats.min, tb->stats.min);
  } else {
    fd->divergence_class = DivergenceClass::kInputDiffers;
  }
  fd->detail = fmt::format("input {} differs; it is {}", first_diff_input, origin);
  if (uninit && ta && ta->base_id >= 0) {
    const std::string by = sa.allocated_by(ta->base_id);
    if (!by.empty())
      fd->detail = fmt::format(
          "input {} differs: bytes {} returned uninitialized, read before "
          "any op wrote them",
          first_diff_input, by);
  }
}

// Every input agreed when the op began: an argument, what a collective received, shared memory
// written meanwhile, else the op itself.
void classify_same_inputs(const BufferedOp& a, const OpSource& sa, const BufferedOp& b,
                          const OpSource& sb, FirstDivergence* fd) {
  const trace::TraceReader& ra = sa.reader();
  const trace::TraceReader& rb = sb.reader();
  const trace::OpRecord& oa = a.rec;
  const trace::OpRecord& ob = b.rec;
  if (fd->args_differ) {
    // The same tensors in: the differing value came from outside torch, a Python scalar.
    fd->divergence_class = DivergenceClass::kExternalInput;
    fd->scalar_argument = first_differing_value(oa.inputs, ra, ob.inputs, rb);
    fd->detail = fmt::format(
        "same tensor inputs, a non-tensor argument differs ({}): a value "
        "computed outside torch",
        fd->scalar_argument.empty() ? "in a list" : fd->scalar_argument);
    return;
  }
  if (a.collective && a.received) {
    fd->divergence_class = DivergenceClass::kRemoteInput;
    fd->received_through = fmt::format("{} #{} of group {}", fd->op, a.coll.seq, a.coll.group);
    fd->detail = fmt::format(
        "this rank's inputs to {} agree, what it received differs: another of the group's {} "
        "ranks sent different data",
        fd->received_through, a.coll.group_size);
    return;
  }
  // Inputs hashed the same when the op began, and one is in shared memory: another process
  // wrote it while the op read it (Hogwild).
  for (size_t i = 0; i < oa.input_tensors.size(); ++i) {
    const TensorDesc* t = ra.tensor(oa.input_tensors[i]);
    for (int hops = 0; t && hops < 64 && t->sharing == trace::Sharing::kNone &&
                       t->provenance() == trace::Provenance::kView;
         ++hops)
      t = ra.tensor(t->base_id);
    if (!t || t->sharing == trace::Sharing::kNone || oa.input_written(i)) continue;
    fd->divergence_class = DivergenceClass::kSharedMemory;
    fd->detail = fmt::format(
        "identical inputs when the op began, different outputs: input {} is in shared memory, "
        "which another process can write while the op reads it",
        i);
    return;
  }
  fd->divergence_class = DivergenceClass::kNondeterministicOp;
  if (oa.results_hash != ob.results_hash) {
    fd->detail = fmt::format("identical inputs and arguments, a different scalar return ({})",
                             first_differing_value(oa.outputs, ra, ob.outputs, rb));
    return;
  }
  fd->detail = oa.is_random() ? "identical inputs, arguments and generator state, different outputs"
                              : "identical inputs and arguments, different outputs";
}

}  // namespace

void classify_divergence(const BufferedOp& a, const OpSource& sa, const BufferedOp& b,
                         const OpSource& sb, const GateConfig& gate, FirstDivergence* fd,
                         const SeenOutputs* seen) {
  const trace::TraceReader& ra = sa.reader();
  const trace::TraceReader& rb = sb.reader();
  const trace::OpRecord& oa = a.rec;
  const trace::OpRecord& ob = b.rec;
  fd->op = std::string(sa.name_of(oa));
  fd->step = oa.step;
  fd->phase = std::string(trace::phase_name(oa.phase));
  fd->index = a.index;
  fd->order_a = oa.order;
  fd->order_b = ob.order;
  fd->offset_a = oa.offset;
  fd->offset_b = ob.offset;
  fd->is_random = oa.is_random();
  fd->rng_a = oa.rng;
  fd->rng_b = ob.rng;
  fd->args_differ = oa.args_hash != ob.args_hash;

  const int first_diff_input = pair_tensors(a, sa, b, sb, fd);
  output_deltas(oa, ra, ob, rb, gate, &fd->magnitude);

  const trace::StepInfo* step_a = sa.step_info(oa.step);
  const trace::StepInfo* step_b = sb.step_info(ob.step);
  bool step_rng_differs = step_a && step_b &&
                          (step_a->rng_cpu != step_b->rng_cpu ||
                           step_a->rng_cuda != step_b->rng_cuda);
  bool rng_differs = oa.is_random() && ((oa.has_rng() && ob.has_rng() && oa.rng != ob.rng) ||
                                        (!oa.has_rng() && step_rng_differs));
  if (rng_differs) {
    fd->divergence_class = DivergenceClass::kRngState;
    fd->detail = oa.has_rng()
                     ? fmt::format("random op with different generator state: {:016x} vs {:016x}",
                                   oa.rng, ob.rng)
                     : fmt::format("random op in a step whose RNG state differs at its start");
    return;
  }
  if (a.compiled_region != BufferedOp::kNoRegion)
    fd->compiled_region = std::string(ra.string(a.compiled_region));
  if (first_diff_input >= 0)
    classify_differing_input(a, sa, b, sb, first_diff_input, seen, fd);
  else
    classify_same_inputs(a, sa, b, sb, fd);
}

std::string kernel_origin(const trace::OpRecord& op, const trace::TraceReader& r) {
  if (!trace::is_compiled_kernel(r.string(op.name))) return "";
  for (const trace::Value& v : op.inputs)
    if (v.type == trace::ValueType::kString) return std::string(r.string(uint64_t(v.i)));
  return "";
}

std::optional<CatalogRef> catalog_ref(const Catalog* catalog, const OpFacts& facts,
                                      std::vector<std::string>* rejected) {
  if (!catalog) return std::nullopt;
  for (const CatalogEntry* e : catalog->lookup(facts.name)) {
    if (std::find(rejected->begin(), rejected->end(), e->id) != rejected->end()) continue;
    CatalogMatch m = evaluate(*e, facts);
    if (!m.applies) {
      if (!m.unmet.empty()) rejected->push_back(e->id);
      continue;
    }
    CatalogRef r;
    r.id = e->id;
    r.op = std::string(facts.name);
    r.condition = e->condition;
    r.remedy = e->remedy;
    r.uncertain = e->uncertain;
    r.uncertainty = e->uncertainty;
    r.conditions_met = m.met;
    r.conditions_unknown = m.unknown;
    r.sources = e->sources;
    return r;
  }
  return std::nullopt;
}

namespace {

// A key one fingerprint lacks is another torch's (or detaudit's) fingerprint, not a setting
// that differs: never a cause by itself.
bool a_setting_differs(const EnvDifference& d) { return d.a != "(absent)" && d.b != "(absent)"; }

const EnvDifference* find_env(const std::vector<EnvDifference>& env,
                              std::initializer_list<const char*> keys) {
  // "intra_op_threads (step 3)" matches "intra_op_threads".
  for (const EnvDifference& d : env)
    if (a_setting_differs(d))
      for (std::string_view k : keys)
        if (d.key.compare(0, k.size(), k) == 0 &&
            (d.key.size() == k.size() || d.key[k.size()] == ' '))
          return &d;
  return nullptr;
}

const EnvDifference* find_env_containing(const std::vector<EnvDifference>& env,
                                         std::initializer_list<const char*> parts) {
  for (const EnvDifference& d : env)
    if (a_setting_differs(d))
      for (const char* p : parts)
        if (d.key.find(p) != std::string::npos) return &d;
  return nullptr;
}

// The torch builds differ: their versions, else their commits (two builds of one version).
const EnvDifference* find_torch_build(const std::vector<EnvDifference>& env) {
  for (const char* key : {"torch_version", "build_config.COMMIT_SHA"})
    for (const EnvDifference& d : env)
      if (d.key == key) return &d;
  return nullptr;
}

const EnvDifference* find_key(const std::vector<EnvDifference>& env, std::string_view part) {
  for (const EnvDifference& d : env)
    if (d.key.find(part) != std::string::npos) return &d;
  return nullptr;
}

// The library that computes an op, where the build names it: "the BLAS library (BLAS_INFO)".
struct Implementer {
  std::string what;              // "the BLAS library"
  const EnvDifference* version;  // how it differs between the builds; null when it does not
};

bool op_or_chain_is(const FirstDivergence& fd, std::initializer_list<std::string_view> names) {
  auto is = [&](std::string_view op) {
    for (std::string_view n : names)
      if (op == n) return true;
    return false;
  };
  if (is(fd.op)) return true;
  for (const std::string& c : fd.chain)
    if (is(c)) return true;
  return false;
}

Implementer implementer_of(const FirstDivergence& fd, bool cpu,
                           const std::vector<EnvDifference>& env) {
  const bool gemm = op_or_chain_is(
      fd, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
           "aten::linear", "aten::addmv", "aten::mv", "aten::dot", "aten::_addmm_activation",
           "aten::einsum", "aten::tensordot"});
  const bool conv = op_or_chain_is(
      fd, {"aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d",
           "aten::conv3d", "aten::mkldnn_convolution", "aten::convolution_backward",
           "aten::cudnn_convolution", "aten::_slow_conv2d_forward", "aten::conv_transpose2d"});
  if (cpu && gemm) {
    const EnvDifference* v = find_key(env, "build_config.BLAS_INFO");
    if (!v) v = find_key(env, "Math Kernel Library");
    return {"the BLAS library (a CPU GEMM)", v};
  }
  if (cpu && conv) return {"oneDNN (MKL-DNN, a CPU convolution)", find_key(env, "MKL-DNN")};
  if (!cpu && gemm) return {"cuBLAS (a GPU GEMM)", find_key(env, "build_config.CUDA_VERSION")};
  if (!cpu && conv) return {"cuDNN (a GPU convolution)", find_key(env, "CUDNN_VERSION")};
  if (cpu) return {"torch's own CPU kernel", find_key(env, "CPU capability")};
  return {"torch's own CUDA kernel", find_key(env, "build_config.CUDA_VERSION")};
}

std::string describe(const EnvDifference& d) {
  return fmt::format("{} differs: {} vs {}", d.key, d.a, d.b);
}

// A difference in what a CUDA kernel ran on: the GPU, its driver, the CUDA libraries (the
// fingerprint's "cuda" object), or an environment variable those libraries read. Whether CUDA
// was up when the fingerprint was written (initialized, available, built) is not one.
const EnvDifference* find_cuda_env(const std::vector<EnvDifference>& env) {
  for (const EnvDifference& d : env) {
    if (d.key.rfind("cuda.", 0) == 0 && d.key != "cuda.initialized" && d.key != "cuda.available" &&
        d.key != "cuda.built")
      return &d;
  }
  return find_env(env, {"env.CUBLAS_WORKSPACE_CONFIG", "env.NVIDIA_TF32_OVERRIDE",
                        "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "env.CUDA_LAUNCH_BLOCKING"});
}

// The first CUDA device among the op's tensors ("cuda:0"), or "".
std::string cuda_device_of(const FirstDivergence& fd) {
  for (const auto* v : {&fd.inputs, &fd.outputs})
    for (const TensorPair& p : *v)
      if (p.a.present && p.a.device.rfind("cuda", 0) == 0) return p.a.device;
  return "";
}

// What computes a GPU op, where one library does: "cuBLAS (a GPU GEMM)"; "" otherwise.
std::string gpu_library_of(const FirstDivergence& fd) {
  const Implementer lib = implementer_of(fd, /*cpu=*/false, {});
  return lib.what.rfind("torch's own", 0) == 0 ? "" : lib.what;
}

// Of the CUDA differences, the one most likely to have changed this op's bits: its own GPU's
// model, then its library's version (cuBLAS for a GEMM, cuDNN for a convolution), else `first`.
const EnvDifference* gpu_suspect(const std::vector<EnvDifference>& env, const FirstDivergence& fd,
                                 const EnvDifference* first) {
  std::string device = cuda_device_of(fd);
  const size_t colon = device.find(':');
  const std::string ordinal = colon == std::string::npos ? "0" : device.substr(colon + 1);
  const std::string lib = gpu_library_of(fd);
  const std::string version = lib.rfind("cuBLAS", 0) == 0  ? "cuda.cublas_version"
                              : lib.rfind("cuDNN", 0) == 0 ? "cuda.cudnn_version"
                                                           : "";
  for (const std::string field : {"name", "compute_capability", "sm_count"})
    if (const EnvDifference* d = find_key(env, "cuda.devices." + ordinal + "." + field)) return d;
  if (!version.empty())
    if (const EnvDifference* d = find_key(env, version)) return d;
  return first;
}

// The same inputs gave other outputs: a setting that differs, else the catalog's entry.
bool explain_nondeterministic(const std::vector<EnvDifference>& env, bool on_cpu,
                              FirstDivergence* fd) {
  const EnvDifference* threads = find_env(env, {"intra_op_threads", "step.intra_op_threads",
                                                "env.OMP_NUM_THREADS", "env.MKL_NUM_THREADS"});
  const EnvDifference* det = find_env_containing(env, {"determinism."});
  const EnvDifference* cuda = on_cpu ? nullptr : find_cuda_env(env);
  if (threads && on_cpu) {
    fd->cause = describe(*threads);
    fd->remedy =
        "run every time with the same intra-op thread count "
        "(torch.set_num_threads / OMP_NUM_THREADS)";
  } else if (det) {
    fd->cause = describe(*det);
    fd->remedy = "use the same determinism settings in every run";
  } else if (cuda) {
    fd->cause = describe(*gpu_suspect(env, *fd, cuda));
    if (const std::string lib = gpu_library_of(*fd); !lib.empty())
      fd->cause += fmt::format(
          "; {} is computed by {}, whose kernels are chosen by GPU model "
          "and library version",
          fd->op, lib);
    fd->remedy = cuda->key.rfind("env.", 0) == 0
                     ? "set the CUDA libraries' environment variables the same in every run"
                     : "compare runs on the same GPU model (architecture and SM count), driver "
                       "and CUDA, cuDNN, cuBLAS and NCCL versions: GPU kernels reproduce bit "
                       "for bit only there";
  } else if (fd->catalog) {
    fd->cause = fmt::format("{} is a known nondeterministic op ({}): {}", fd->catalog->op,
                            fd->catalog->id, fd->catalog->condition);
  } else {
    fd->cause = "the op gave different outputs for identical inputs; it is not in the catalog";
    fd->remedy = "enable use_deterministic_algorithms(True) and check which kernel alerts";
  }
  return true;
}

// A generator's state differed: a seed that differs, else the generator named.
bool explain_rng(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  // PYTHONHASHSEED salts str hashes; it seeds no random generator.
  const EnvDifference* seed = nullptr;
  for (const EnvDifference& d : env)
    if ((d.key.find("seed") != std::string::npos || d.key.find("SEED") != std::string::npos) &&
        d.key.find("PYTHONHASHSEED") == std::string::npos) {
      seed = &d;
      break;
    }
  const std::string device = cuda_device_of(*fd);
  fd->cause = seed ? describe(*seed)
              : device.empty()
                  ? "the random generator was seeded or consumed differently before this op"
                  : fmt::format(
                        "the default CUDA generator of {} (its seed and Philox offset) "
                        "was seeded or consumed differently before this op",
                        device);
  fd->remedy = device.empty()
                   ? "seed every generator at program start (torch.manual_seed, random.seed, "
                     "np.random.seed) and consume random numbers in the same order"
                   : "seed every generator at program start: torch.manual_seed(s) seeds the "
                     "CPU's and every CUDA device's (C++: at::manual_seed), and consume random "
                     "numbers in the same order";
  return true;
}

// Data entering the program differs: the data order, a Python value, a DataLoader worker.
bool explain_external(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  const EnvDifference* hash = find_env(env, {"env.PYTHONHASHSEED"});
  fd->cause = hash ? describe(*hash)
                   : "data entering the program (data loading, from_blob, numpy, another "
                     "thread) differs";
  fd->remedy =
      "make the input pipeline deterministic: seed samplers, shuffles and DataLoader "
      "workers (worker_init_fn, generator=torch.Generator().manual_seed(s))";
  if (!hash && fd->data_order) {
    fd->cause =
        "the data order differs: the same samples were selected or ordered "
        "differently (a shuffle by Python's random, an unseeded sampler)";
    fd->remedy =
        "seed the order: random.seed(s) before a Python shuffle, and DataLoader("
        "generator=torch.Generator().manual_seed(s)) for its sampler";
    if (fd->hash_seed_unset) {
      fd->cause += ", or a set iterated in hash order: PYTHONHASHSEED is unset in both runs";
      fd->remedy += "; iterate sorted(names), not a set, or run with PYTHONHASHSEED=0";
    }
  }
  if (!hash && fd->data_order_through_view) {
    fd->cause = fd->hash_seed_unset
                    ? "tensors were created or picked in another order: likely Python's hash "
                      "randomization, as PYTHONHASHSEED is unset in both runs and iterating a "
                      "set of names (or a dict built from one) orders them anew in each process"
                    : "tensors were created or picked in another order: the same values reach "
                      "this op through views of different tensors";
    fd->remedy =
        "create and pick tensors in a fixed order: iterate sorted(names), not a set; "
        "or run with PYTHONHASHSEED=0. If a shuffle picks them, seed it (random.seed)";
  }
  if (!hash && !fd->scalar_argument.empty()) {
    fd->cause = fmt::format(
        "a Python value passed to the op differs ({}): drawn from an "
        "unseeded generator (random, numpy) or from the clock",
        fd->scalar_argument);
    fd->remedy =
        "seed Python's and NumPy's generators (random.seed, np.random.seed) or draw "
        "the value from a seeded torch.Generator";
  }
  if (!hash && !fd->batch_read_by.empty()) {
    fd->cause =
        "data made in a DataLoader worker differs: what the Dataset drew from outside "
        "torch (NumPy, random, a file) or an unseeded worker";
    fd->remedy =
        "seed what __getitem__ draws from in each worker: worker_init_fn seeding "
        "numpy and random from torch.initial_seed(), and no generator created "
        "unseeded in the Dataset (np.random.default_rng(seed))";
  }
  return true;
}

// Another process wrote the bytes through shared memory.
bool explain_shared_memory(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->cause =
      "another process wrote these bytes through shared memory (share_memory_(), "
      "Hogwild training): whose update lands first, and what each process reads, "
      "follows timing";
  if (!fd->shared_writer.empty()) fd->cause += "; written by " + fd->shared_writer;
  fd->remedy =
      "for a reproducible run, do not share parameters between training processes "
      "(one copy each, averaged in a fixed order), or serialise the writers: a "
      "torch.multiprocessing Lock around each optimizer step, taken in a fixed order";
  return true;
}

// Another rank sent the difference, and its origin was not recorded.
bool explain_remote_input(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->cause =
      "another rank sent different data into this collective, and no stream of that "
      "rank recorded where it diverged";
  fd->remedy =
      "record every rank (--ranks all) so the diff can follow the collective to the "
      "rank where the difference began";
  return true;
}

// Memory of the empty family was read; FSDP's unwritten shards named as such.
bool explain_uninitialized(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->cause = "an op read memory returned by the empty family (uninitialized)";
  fd->remedy =
      "initialise the buffer (torch.zeros) or enable deterministic mode with "
      "fill_uninitialized_memory=True";
  // FSDP2 gathers sharded parameters: garbage there is a parameter no initialiser wrote.
  const bool fsdp_parameter = fd->scope_path.find("FSDP::") != std::string::npos ||
                              (!fd->chain.empty() && fd->chain.front().rfind("fsdp::", 0) == 0);
  if (fsdp_parameter) {
    fd->cause =
        "FSDP gathered a parameter shard that no op wrote: memory from the empty "
        "family, as module.to_empty() leaves every parameter until something "
        "initialises it";
    fd->remedy =
        "after model.to_empty(), initialise every parameter: reset_parameters() "
        "must reach each submodule (or load a checkpoint); "
        "torch.use_deterministic_algorithms(True) only fills the garbage with NaN";
  }
  return true;
}

// Different ops ran: a thread count inside kernels (final: no catalog remedy added), a torch
// build, or control flow.
bool explain_structural(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  const EnvDifference* ver = find_torch_build(env);
  const EnvDifference* threads = find_env(env, {"intra_op_threads", "step.intra_op_threads",
                                                "env.OMP_NUM_THREADS", "env.MKL_NUM_THREADS"});
  if (fd->nested && threads && !ver) {
    // Same ops at every level both runs share; only kernels' internal ops differ, as a
    // parallel reduction's per-thread buffers do with another thread count.
    fd->cause = describe(*threads);
    fd->remedy =
        "run every time with the same intra-op thread count "
        "(torch.set_num_threads / OMP_NUM_THREADS): parallel kernels split their "
        "work, and allocate and combine partial results, by thread count";
    return false;
  }
  if (fd->same_values && !ver) {
    fd->cause =
        "the runs ran other ops for the same values (a refactor, or another decomposition): "
        "every value the replaced ops hand on is equal bit for bit";
    fd->remedy =
        "nothing to fix if the change was meant; `detaudit diff --fail-on tolerance` passes "
        "such regions and fails where values moved";
    return true;
  }
  fd->cause = ver ? describe(*ver)
                  : "the runs executed different ops, shapes or arguments (control flow or "
                    "configuration differs)";
  fd->remedy =
      "make control flow independent of unseeded state; compare runs of the same "
      "program, configuration and PyTorch build";
  return true;
}

// An input made outside the aligned ops differs.
bool explain_input_differs(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->cause =
      "an input produced outside the aligned ops differs (an earlier divergence in "
      "another stream, or an unrecorded write)";
  fd->remedy = "look at the other streams' divergences and at in-place writes by unrecorded ops";
  return true;
}

// Another torch build gave other bits for the same inputs: which build, and which library
// computes the op, are the answer; the kernel need not be nondeterministic.
bool explain_torch_build(const std::vector<EnvDifference>& env, bool on_cpu, FirstDivergence* fd) {
  const EnvDifference* build = find_torch_build(env);
  const Implementer lib = implementer_of(*fd, on_cpu, env);
  const std::string builds = build->key == "torch_version"
                                 ? fmt::format("torch {} in run A, {} in run B", build->a, build->b)
                                 : fmt::format("two builds of one torch version (commit {} vs {})",
                                               build->a, build->b);
  fd->cause = fmt::format("the torch build differs ({}); {} is computed by {}", builds, fd->op,
                          lib.what);
  if (lib.version)
    fd->cause += fmt::format(", {} in run A and {} in run B", lib.version->a, lib.version->b);
  else
    fd->cause += ", whose code can change between builds";
  fd->remedy =
      "to test reproducibility, compare runs of one torch build; across builds, bits are not "
      "expected to match: gate on a tolerance (--fail-on tolerance with --ulp N or --rtol) and "
      "read where the numerics first leave it";
  return false;
}

// Each class's explanation; false when its remedy is final (no catalog remedy added).
using ExplainFn = bool (*)(const std::vector<EnvDifference>& env, bool on_cpu, FirstDivergence* fd);
struct ClassExplanation {
  DivergenceClass divergence_class;
  ExplainFn explain;
};
constexpr ClassExplanation kExplanations[] = {
    {DivergenceClass::kNondeterministicOp, explain_nondeterministic},
    {DivergenceClass::kRngState, explain_rng},
    {DivergenceClass::kExternalInput, explain_external},
    {DivergenceClass::kSharedMemory, explain_shared_memory},
    {DivergenceClass::kRemoteInput, explain_remote_input},
    {DivergenceClass::kUninitializedMemory, explain_uninitialized},
    {DivergenceClass::kStructural, explain_structural},
    {DivergenceClass::kTorchBuild, explain_torch_build},
};

}  // namespace

bool torch_builds_differ(const std::vector<EnvDifference>& env) {
  return find_torch_build(env) != nullptr;
}

bool on_cpu(const FirstDivergence& fd) {
  for (const auto* v : {&fd.outputs, &fd.inputs})
    for (const TensorPair& p : *v)
      if (p.a.present && p.a.device.rfind("cpu", 0) != 0) return false;
  return true;
}

void classify_structural(std::string detail, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kStructural;
  fd->detail = std::move(detail);
}

void classify_shared_writer(int input, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kSharedMemory;
  fd->detail = fmt::format(
      "input {} is in shared memory, written outside this process: another recorded process "
      "writes it",
      input);
}

void classify_under_torch_builds(const std::vector<EnvDifference>& env, FirstDivergence* fd) {
  if (fd->divergence_class != DivergenceClass::kNondeterministicOp ||
      fd->arose_in_compiled_region || !find_torch_build(env))
    return;
  fd->divergence_class = DivergenceClass::kTorchBuild;
  fd->detail += ", under another torch build";
}

void classify_step_level(std::string detail, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kStepLevel;
  fd->detail = std::move(detail);
}

void classify_resumed_data_order(FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kExternalInput;
  fd->data_order = true;
}

void explain_cause(const std::vector<EnvDifference>& env, FirstDivergence* fd) {
  if (fd->arose_in_compiled_region) {
    fd->cause = fmt::format(
        "a kernel inside the torch.compile region {} (inductor-generated, not "
        "recorded) gave different results for the same inputs",
        fd->compiled_region);
    fd->remedy =
        "torch.use_deterministic_algorithms(True) before compiling; to name the op, "
        "audit again without compilation: --env TORCHDYNAMO_DISABLE=1";
    return;
  }
  ExplainFn explain = explain_input_differs;  // input-differs, and any class not listed
  for (const ClassExplanation& e : kExplanations)
    if (fd->divergence_class == e.divergence_class) explain = e.explain;
  if (!explain(env, on_cpu(*fd), fd)) return;
  if (fd->catalog && fd->remedy.empty()) fd->remedy = fd->catalog->remedy;
  if (fd->catalog && fd->divergence_class == DivergenceClass::kNondeterministicOp &&
      fd->remedy != fd->catalog->remedy)
    fd->remedy += "; catalog: " + fd->catalog->remedy;
}

}  // namespace detaudit
