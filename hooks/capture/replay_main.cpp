// detaudit_replay: calls recorded ops again and again on inputs a capture saved
// (hooks/capture/op_capture.h), in a fresh process of the program's own torch, and prints what
// came out as JSON. The CLI (src/replay/, src/coverage/) runs it and judges.
//
//   detaudit_replay INPUTS.pt OP OVERLOAD --replays 20 --threads 2 --deterministic off
//                   [--busy-thread] [--rng RNG.pt] --digest xxh3
//   detaudit_replay --batch MANIFEST.json     (one JSON line per op and setting, as each ends)
//   detaudit_replay --write-sets < SCHEMAS    (what the recorder takes each schema, one a line,
//                                              to write: tests/e2e/test_write_sets.py)
//
// Every replay gets fresh copies of the inputs, laid out as the op received them, so an in-place
// op starts from the captured bytes each time, and the generator the op drew from is set back to
// its captured state, so a random op draws the same numbers. Outputs are hashed as the recorder
// hashes them (describe_tensor), so a replay's digest compares with the trace's.
//
// The manifest: {"digest": "md5", "replays": 20, "deadline_ms": <Unix time>, "ops": [{"id": "7",
// "inputs": "...inputs.pt", "rng": "...rng.pt" or "", "op": "aten::mm", "overload": "",
// "outputs": [0, 2] (those compared; absent: all), "settings": [{"setting": "as recorded",
// "threads": 2, "deterministic": false, "busy": false, "until_differs": 180}, ...]}, ...]}. A
// series that would start after the deadline is not run. Each line says how many cores the op's
// threads got on average ("cores_used").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <pthread.h>
#include <time.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "digest/digest.h"
#include "ops/op_schema.h"
#include "tensors/tensor_copy.h"
#include "tensors/tensor_digest.h"

namespace {

using detaudit::Hasher;
using nlohmann::json;

int fail(const std::string& why) {
  std::fprintf(stderr, "detaudit_replay: %s\n", why.c_str());
  return 2;
}

c10::IValue fresh_copy(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined())
    return detaudit::hooks::copy_with_layout(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList())
      out.push_back(detaudit::hooks::copy_with_layout(t));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) out.push_back(fresh_copy(e));
    return out;
  }
  return v;
}

void tensors_of(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out->push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out->push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) tensors_of(e, out);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) tensors_of(e, out);
  }
}

std::string digest_hex(const at::Tensor& t, Hasher* hasher) {
  if (detaudit::hooks::unhashable_reason(t)) return "";
  detaudit::trace::TensorDesc desc;
  detaudit::hooks::describe_tensor(t, hasher, /*with_stats=*/false, &desc);
  return desc.digest_hex();
}

c10::IValue load_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  c10::IValue v = torch::jit::pickle_load(bytes);
  if (!v.isTuple()) throw std::runtime_error(path + ": not a capture (no tuple)");
  return v;
}

// One captured op: its inputs, and the generator it drew from with the state it had.
struct Captured {
  std::vector<c10::IValue> inputs;
  c10::OperatorHandle handle;
  std::optional<at::Generator> generator;
  at::Tensor generator_state;
  std::vector<int> compared_outputs;  // empty: every output
};

Captured load_captured(const std::string& inputs_path, const std::string& rng_path,
                       const std::string& op_name, const std::string& overload) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op_name, overload});
  if (!handle)
    throw std::runtime_error("this torch has no op " + op_name +
                             (overload.empty() ? "" : "." + overload));
  Captured c{load_pickle(inputs_path).toTupleRef().elements().vec(), *handle, {}, {}, {}};
  // None where the schema wants a Tensor was an undefined tensor (op_capture.cpp).
  const auto& params = handle->schema().arguments();
  for (size_t i = 0; i < c.inputs.size() && i < params.size(); ++i)
    if (c.inputs[i].isNone() && params[i].type()->kind() == c10::TypeKind::TensorType)
      c.inputs[i] = at::Tensor();
  if (!rng_path.empty()) {
    const auto saved = load_pickle(rng_path).toTupleRef().elements();
    c.generator = at::globalContext().defaultGenerator(c10::Device(saved.at(0).toStringRef()));
    c.generator_state = saved.at(1).toTensor();
  }
  return c;
}

struct Setting {
  std::string name;
  int threads = 0;
  bool deterministic = false, busy = false;
  // Up to this many replays more while every output is the same: a known racy op on a loaded
  // machine can run its threads one after the other for many replays.
  int until_differs = 0;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The op called `replays` times under one setting (and up to `until_differs` more while the
// outputs agree, before `deadline_ms`).
json replay_series(const Captured& c, const Setting& setting, int replays, int64_t deadline_ms,
                   Hasher* hasher) {
  if (setting.threads > 0) at::set_num_threads(setting.threads);
  at::globalContext().setDeterministicAlgorithms(setting.deterministic, /*warn_only=*/false);
  std::vector<at::Tensor> input_tensors;
  for (const c10::IValue& v : c.inputs) tensors_of(v, &input_tensors);
  json input_digests = json::array();
  for (const at::Tensor& t : input_tensors) input_digests.push_back(digest_hex(t, hasher));

  // A second thread that keeps a core busy: a race shows more often when threads are delayed.
  std::atomic<bool> stop{false};
  std::thread spinner;
  if (setting.busy)
    spinner = std::thread([&] {
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });

  // The cores the op's threads got: the process's CPU time less the spinner's, over the wall
  // time of the calls. Under 1 when other programs took the machine's cores.
  clockid_t spinner_clock = 0;
  const bool spinner_timed = spinner.joinable() &&
                             pthread_getcpuclockid(spinner.native_handle(), &spinner_clock) == 0;
  double op_cpu_s = 0, op_wall_s = 0;

  std::map<std::string, int> distinct;  // digests of one replay's outputs -> count
  std::vector<at::Tensor> first;
  double max_abs_diff = 0;
  json per_replay = json::array();
  std::string error;
  for (int r = 0; error.empty(); ++r) {
    // Past `replays`: up to until_differs more while every output agreed, before the deadline.
    if (r >= replays && (r >= replays + setting.until_differs || distinct.size() != 1 ||
                         (deadline_ms != 0 && now_ms() >= deadline_ms)))
      break;
    torch::jit::Stack stack;
    for (const c10::IValue& v : c.inputs) stack.push_back(fresh_copy(v));
    try {
      if (c.generator) {
        at::Generator gen = *c.generator;  // a handle: the same generator
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(c.generator_state);
      }
      const double cpu0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
      const double spin0 = spinner_timed ? cpu_seconds(spinner_clock) : 0;
      const auto wall0 = std::chrono::steady_clock::now();
      c.handle.callBoxed(&stack);
      op_wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      op_cpu_s += cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0 -
                  (spinner_timed ? cpu_seconds(spinner_clock) - spin0 : 0);
    } catch (const std::exception& e) {
      error = e.what();
      break;
    }
    std::vector<at::Tensor> all, outs;
    for (const c10::IValue& v : stack) tensors_of(v, &all);
    if (c.compared_outputs.empty()) {
      outs = all;
    } else {
      for (int k : c.compared_outputs)
        if (k >= 0 && size_t(k) < all.size()) outs.push_back(all[size_t(k)]);
    }
    std::string key;
    json digests = json::array();
    for (const at::Tensor& t : outs) {
      const std::string d = digest_hex(t, hasher);
      digests.push_back(d);
      key += d + ",";
    }
    per_replay.push_back(digests);
    ++distinct[key];
    if (r == 0) {
      first = outs;
    } else {
      for (size_t k = 0; k < outs.size() && k < first.size(); ++k)
        if (outs[k].is_floating_point() && outs[k].sizes() == first[k].sizes())
          max_abs_diff = std::max(
              max_abs_diff,
              (outs[k].to(at::kDouble) - first[k].to(at::kDouble)).abs().max().item<double>());
    }
  }
  stop = true;
  if (spinner.joinable()) spinner.join();
  json out = {{"op", c.handle.schema().name()},
              {"overload", c.handle.schema().overload_name()},
              {"setting", setting.name},
              {"replays", per_replay.size()},
              {"threads", at::get_num_threads()},
              {"deterministic", setting.deterministic},
              {"busy_thread", setting.busy},
              {"input_digests", input_digests},
              {"outputs", per_replay},
              {"distinct", distinct.size()},
              {"max_abs_diff", max_abs_diff},
              {"cores_used", op_wall_s > 0 ? op_cpu_s / op_wall_s : 0.0}};
  if (!error.empty()) out["error"] = error;
  return out;
}

// --batch: each op of the manifest under each of its settings, a line as each series ends, so a
// budget's kill keeps what was done.
int run_batch(const std::string& manifest_path) {
  std::ifstream in(manifest_path);
  json m = json::parse(in, nullptr, false);
  if (!m.is_object() || !m.contains("ops")) return fail(manifest_path + ": not a replay manifest");
  detaudit::trace::DigestAlgo algo;
  if (!detaudit::trace::parse_digest_name(m.value("digest", "xxh3"), &algo))
    return fail(manifest_path + ": unknown digest");
  Hasher hasher(algo);
  const int replays = m.value("replays", 20);
  const int64_t deadline = m.value("deadline_ms", int64_t(0));
  for (const json& op : m["ops"]) {
    const std::string id = op.value("id", "");
    std::optional<Captured> c;
    try {
      c = load_captured(op.at("inputs").get<std::string>(), op.value("rng", ""),
                        op.at("op").get<std::string>(), op.value("overload", ""));
      if (op.contains("outputs")) c->compared_outputs = op["outputs"].get<std::vector<int>>();
    } catch (const std::exception& e) {
      std::printf("%s\n", json({{"id", id}, {"error", e.what()}}).dump().c_str());
      std::fflush(stdout);
      continue;
    }
    for (const json& s : op.at("settings")) {
      if (deadline > 0 && now_ms() > deadline) return 0;
      Setting setting{s.value("setting", ""), s.value("threads", 0),
                      s.value("deterministic", false), s.value("busy", false),
                      s.value("until_differs", 0)};
      json out;
      try {
        out = replay_series(*c, setting, replays, deadline, &hasher);
      } catch (const std::exception& e) {
        out = {{"error", e.what()}, {"setting", setting.name}};
      }
      out["id"] = id;
      std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

// Each schema read from stdin, parsed as torch parses its registry's, and its write set; a schema
// naming a class this process has not registered (a Python library's) is said to be unparsed.
int write_sets() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    try {
      std::printf("%s\n",
                  detaudit::hooks::describe_write_set(torch::jit::parseSchema(line)).c_str());
    } catch (const std::exception&) {
      std::printf("%s\tunparsed\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--batch") return run_batch(argv[2]);
  if (argc == 2 && std::string(argv[1]) == "--write-sets") return write_sets();
  if (argc < 4) return fail("usage: detaudit_replay INPUTS.pt OP OVERLOAD [options]");
  const std::string inputs_path = argv[1], op_name = argv[2], overload = argv[3];
  int replays = 20;
  Setting setting;
  std::string digest = "xxh3", rng;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--replays")
      replays = std::atoi(value().c_str());
    else if (a == "--threads")
      setting.threads = std::atoi(value().c_str());
    else if (a == "--deterministic")
      setting.deterministic = value() == "on";
    else if (a == "--busy-thread")
      setting.busy = true;
    else if (a == "--digest")
      digest = value();
    else if (a == "--rng")
      rng = value();
    else
      return fail("unknown option " + a);
  }
  detaudit::trace::DigestAlgo algo;
  if (!detaudit::trace::parse_digest_name(digest, &algo)) return fail("unknown digest " + digest);
  if (replays < 1) return fail("--replays must be at least 1");
  json out;
  try {
    Hasher hasher(algo);
    out = replay_series(load_captured(inputs_path, rng, op_name, overload), setting, replays,
                        /*deadline_ms=*/0, &hasher);
  } catch (const std::exception& e) {
    return fail(inputs_path + ": " + e.what());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
