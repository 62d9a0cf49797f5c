// The divergence class: decided here, and only here, from the evidence (evidence.h) of an
// aligned pair of ops, and from the rules whose evidence is found beyond one pair.
#include "diff/classify.h"

#include <fmt/format.h>

#include <algorithm>

namespace detaudit {
namespace {

using trace::TensorDesc;

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

// The differing input is, in both runs, an earlier op's output both made (or a view of one),
// but a different one: the same tensors in another selection or order. True when classified.
bool classify_data_order(const TensorDesc* ta, const OpSource& sa, const TensorDesc* tb,
                         const OpSource& sb, const SeenOutputs& seen, int input,
                         FirstDivergence* fd) {
  if (ta && tb && SeenOutputs::has(seen.b, ta->digest) && SeenOutputs::has(seen.a, tb->digest)) {
    // Each run's tensor is one the other run made too: a Python shuffle of samples, an
    // unseeded sampler.
    fd->divergence_class = DivergenceClass::kExternalInput;
    fd->evidence.data_order = true;
    fd->evidence.detail = fmt::format(
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
  fd->evidence.data_order = true;
  fd->evidence.data_order_through_view = true;
  fd->evidence.detail = fmt::format(
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
    fd->evidence.detail = fmt::format(
        "input {} is a CPU generator's state (torch.get_rng_state(), 5056 bytes): the "
        "generator was seeded or consumed differently before this op",
        first_diff_input);
    return;
  }
  if (compiled && !fd->evidence.compiled_region.empty()) {
    // The region's own recorded inputs matched (it would have diverged first otherwise): the
    // difference arose inside it, in kernels the dispatcher never sees.
    fd->divergence_class = DivergenceClass::kNondeterministicOp;
    fd->evidence.arose_in_compiled_region = true;
    fd->evidence.detail = fmt::format(
        "input {} was made inside the compiled region {}, whose recorded inputs matched: the "
        "difference arose in its kernels, which run below the dispatcher and are not recorded",
        first_diff_input, fd->evidence.compiled_region);
    return;
  }
  if (changed_elsewhere(ta, ra) || changed_elsewhere(tb, rb)) {
    fd->divergence_class = DivergenceClass::kSharedMemory;
    fd->evidence.detail = fmt::format(
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
    fd->evidence.detail = fmt::format(
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
      fd->evidence.scalar_argument = fmt::format("{:.17g} vs {:.17g}", ta->stats.min,
                                                 tb->stats.min);
  } else {
    fd->divergence_class = DivergenceClass::kInputDiffers;
  }
  fd->evidence.detail = fmt::format("input {} differs; it is {}", first_diff_input, origin);
  if (uninit && ta && ta->base_id >= 0) {
    const std::string by = sa.allocated_by(ta->base_id);
    if (!by.empty())
      fd->evidence.detail = fmt::format(
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
  if (fd->evidence.args_differ) {
    // The same tensors in: the differing value came from outside torch, a Python scalar.
    fd->divergence_class = DivergenceClass::kExternalInput;
    fd->evidence.scalar_argument = first_differing_value(oa.inputs, ra, ob.inputs, rb);
    fd->evidence.detail = fmt::format(
        "same tensor inputs, a non-tensor argument differs ({}): a value "
        "computed outside torch",
        fd->evidence.scalar_argument.empty() ? "in a list" : fd->evidence.scalar_argument);
    return;
  }
  if (a.collective && a.received) {
    fd->divergence_class = DivergenceClass::kRemoteInput;
    fd->evidence.received_through = fmt::format("{} #{} of group {}", fd->op, a.coll.seq,
                                                a.coll.group);
    fd->evidence.detail = fmt::format(
        "this rank's inputs to {} agree, what it received differs: another of the group's {} "
        "ranks sent different data",
        fd->evidence.received_through, a.coll.group_size);
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
    fd->evidence.detail = fmt::format(
        "identical inputs when the op began, different outputs: input {} is in shared memory, "
        "which another process can write while the op reads it",
        i);
    return;
  }
  fd->divergence_class = DivergenceClass::kNondeterministicOp;
  if (oa.results_hash != ob.results_hash) {
    fd->evidence.detail = fmt::format(
        "identical inputs and arguments, a different scalar return ({})",
        first_differing_value(oa.outputs, ra, ob.outputs, rb));
    return;
  }
  fd->evidence.detail = oa.is_random()
                            ? "identical inputs, arguments and generator state, different outputs"
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
  fd->evidence.is_random = oa.is_random();
  fd->evidence.rng_a = oa.rng;
  fd->evidence.rng_b = ob.rng;
  fd->evidence.args_differ = oa.args_hash != ob.args_hash;

  const int first_diff_input = pair_tensors(a, sa, b, sb, fd);
  output_deltas(oa, ra, ob, rb, gate, &fd->evidence.magnitude);

  const trace::StepInfo* step_a = sa.step_info(oa.step);
  const trace::StepInfo* step_b = sb.step_info(ob.step);
  bool step_rng_differs = step_a && step_b &&
                          (step_a->rng_cpu != step_b->rng_cpu ||
                           step_a->rng_cuda != step_b->rng_cuda);
  bool rng_differs = oa.is_random() && ((oa.has_rng() && ob.has_rng() && oa.rng != ob.rng) ||
                                        (!oa.has_rng() && step_rng_differs));
  if (rng_differs) {
    fd->divergence_class = DivergenceClass::kRngState;
    fd->evidence.detail =
        oa.has_rng() ? fmt::format("random op with different generator state: {:016x} vs {:016x}",
                                   oa.rng, ob.rng)
                     : fmt::format("random op in a step whose RNG state differs at its start");
    return;
  }
  if (a.compiled_region != BufferedOp::kNoRegion)
    fd->evidence.compiled_region = std::string(ra.string(a.compiled_region));
  if (first_diff_input >= 0)
    classify_differing_input(a, sa, b, sb, first_diff_input, seen, fd);
  else
    classify_same_inputs(a, sa, b, sb, fd);
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

void classify_structural(std::string detail, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kStructural;
  fd->evidence.detail = std::move(detail);
}

void classify_shared_writer(int input, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kSharedMemory;
  fd->evidence.detail = fmt::format(
      "input {} is in shared memory, written outside this process: another recorded process "
      "writes it",
      input);
}

void classify_under_torch_builds(const std::vector<EnvDifference>& env, FirstDivergence* fd) {
  if (fd->divergence_class != DivergenceClass::kNondeterministicOp ||
      fd->evidence.arose_in_compiled_region || !torch_builds_differ(env))
    return;
  fd->divergence_class = DivergenceClass::kTorchBuild;
  fd->evidence.detail += ", under another torch build";
}

void classify_step_level(std::string detail, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kStepLevel;
  fd->evidence.detail = std::move(detail);
}

void classify_resumed_data_order(FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kExternalInput;
  fd->evidence.data_order = true;
}

void classify_resumed_generator(std::string detail, FirstDivergence* fd) {
  fd->divergence_class = DivergenceClass::kRngState;
  fd->evidence.data_order = false;
  fd->evidence.detail = std::move(detail);
}

}  // namespace detaudit
