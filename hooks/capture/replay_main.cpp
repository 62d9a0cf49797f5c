// detaudit_replay: calls one op N times on inputs a capture saved (hooks/capture/op_capture.h), in a fresh
// process of the program's own torch, and prints what came out as one JSON object. The CLI
// (src/replay/) runs it and judges.
//
//   detaudit_replay INPUTS.pt OP OVERLOAD --replays 20 --threads 2 --deterministic off
//                   [--busy-thread] --digest xxh3
//
// Every replay gets fresh copies of the inputs, laid out as the op received them, so an in-place
// op starts from the captured bytes each time. Outputs are hashed as the recorder hashes them
// (describe_tensor), so a replay's digest compares with the trace's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "digest/digest.h"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return fail("usage: detaudit_replay INPUTS.pt OP OVERLOAD [options]");
  const std::string inputs_path = argv[1], op_name = argv[2], overload = argv[3];
  int replays = 20, threads = 0;
  bool deterministic = false, busy = false;
  std::string digest = "xxh3";
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--replays")
      replays = std::atoi(value().c_str());
    else if (a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "--deterministic")
      deterministic = value() == "on";
    else if (a == "--busy-thread")
      busy = true;
    else if (a == "--digest")
      digest = value();
    else
      return fail("unknown option " + a);
  }
  detaudit::trace::DigestAlgo algo;
  if (!detaudit::trace::parse_digest_name(digest, &algo)) return fail("unknown digest " + digest);
  if (replays < 1) return fail("--replays must be at least 1");

  std::ifstream in(inputs_path, std::ios::binary);
  if (!in) return fail("cannot read " + inputs_path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  json out;
  try {
    const c10::IValue saved = torch::jit::pickle_load(bytes);
    if (!saved.isTuple()) return fail(inputs_path + ": not a capture (no tuple of inputs)");
    const std::vector<c10::IValue> inputs = saved.toTupleRef().elements().vec();

    const auto handle = c10::Dispatcher::singleton().findSchema({op_name, overload});
    if (!handle)
      return fail("this torch has no op " + op_name + (overload.empty() ? "" : "." + overload));

    if (threads > 0) at::set_num_threads(threads);
    at::globalContext().setDeterministicAlgorithms(deterministic, /*warn_only=*/false);
    Hasher hasher(algo);

    std::vector<at::Tensor> input_tensors;
    for (const c10::IValue& v : inputs) tensors_of(v, &input_tensors);
    json input_digests = json::array();
    for (const at::Tensor& t : input_tensors) input_digests.push_back(digest_hex(t, &hasher));

    // A second thread that keeps a core busy: a race shows more often when threads are delayed.
    std::atomic<bool> stop{false};
    std::thread spinner;
    if (busy)
      spinner = std::thread([&] {
        volatile double x = 1;
        while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
      });

    std::map<std::string, int> distinct;  // digests of one replay's outputs -> count
    std::vector<at::Tensor> first;
    double max_abs_diff = 0;
    json per_replay = json::array();
    std::string error;
    for (int r = 0; r < replays && error.empty(); ++r) {
      torch::jit::Stack stack;
      for (const c10::IValue& v : inputs) stack.push_back(fresh_copy(v));
      try {
        handle->callBoxed(&stack);
      } catch (const std::exception& e) {
        error = e.what();
        break;
      }
      std::vector<at::Tensor> outs;
      for (const c10::IValue& v : stack) tensors_of(v, &outs);
      std::string key;
      json digests = json::array();
      for (const at::Tensor& t : outs) {
        const std::string d = digest_hex(t, &hasher);
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
    out = {{"op", op_name},
           {"overload", overload},
           {"replays", per_replay.size()},
           {"threads", at::get_num_threads()},
           {"deterministic", deterministic},
           {"busy_thread", busy},
           {"input_digests", input_digests},
           {"outputs", per_replay},
           {"distinct", distinct.size()},
           {"max_abs_diff", max_abs_diff}};
    if (!error.empty()) out["error"] = error;
  } catch (const std::exception& e) {
    return fail(inputs_path + ": " + e.what());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
