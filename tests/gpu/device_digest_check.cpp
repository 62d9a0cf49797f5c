// The device digest kernels (two-pass and fused) against their CPU reference, bit for bit, on a
// real GPU: every dtype, empty, odd and multi-leaf sizes, random bytes (NaN and Inf patterns) and
// finite values, views made contiguous on the stream as the recorder does, and tensors alone and
// in one batch. The fused kernel reads views in place through their strides (a transpose, a
// slice, a broadcast), and must also write its completion word and leave its counters at zero. Then the same through the pipeline (CudaQueue, a collector thread) behind a 200 ms
// kernel: the host must have submitted every batch while the stream is still busy, and the
// results must not change. Last, each kernel's throughput on 1 GiB and on batches of small
// tensors, against a device-to-device copy of the same bytes, as one "THROUGHPUT {json}" line
// (measured, never asserted). Exit 0: all equal; 1: a mismatch (printed); 77: no GPU. Run by
// tests/gpu/test_device_digest.py.
#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device/cuda_queue.h"
#include "device/lane_kernel.h"
#include "device/strided_job.h"
#include "digest/device_digest.h"

using namespace detaudit;

namespace {

using Kernel = device::CudaQueue::Kernel;

int failures = 0;
Kernel g_kernel = Kernel::kTwoPass;  // the kernel the checks run

const char* kernel_name(Kernel k) { return k == Kernel::kFused ? "fused" : "two-pass"; }

// One launch of g_kernel on `stream`; the fused kernel's completion word and counters checked.
void launch(const std::vector<device::DigestJob>& jobs, void* results, cudaStream_t stream,
            at::Tensor* scratch, bool check_fused) {
  const int n = int(jobs.size());
  auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  int rc;
  if (g_kernel == Kernel::kTwoPass) {
    if (!scratch->defined())
      *scratch = at::empty({int64_t(device::lane_scratch_bytes(jobs.data(), n)) + 8}, opts);
    rc = device::launch_lane_digest(jobs.data(), n, scratch->data_ptr(),
                                    static_cast<lanes::LaneResult*>(results), stream);
  } else {
    // Zeroed counters, then the groups' entries; the completion word in the last 8 bytes.
    const size_t bytes = device::fused_scratch_bytes(jobs.data(), n);
    if (!scratch->defined()) *scratch = at::zeros({int64_t(bytes) + 8}, opts);
    auto* done = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(scratch->data_ptr()) + bytes);
    static uint64_t seq = 0;
    rc = device::launch_fused_digest(jobs.data(), n, scratch->data_ptr(),
                                     static_cast<lanes::LaneResult*>(results), done, ++seq, stream);
    if (rc == 0 && check_fused) {
      uint64_t word = 0;
      std::vector<uint32_t> counters(device::kCounterBytes / sizeof(uint32_t));
      cudaMemcpyAsync(&word, done, sizeof word, cudaMemcpyDeviceToHost, stream);
      cudaMemcpyAsync(counters.data(), scratch->data_ptr(), device::kCounterBytes,
                      cudaMemcpyDeviceToHost, stream);
      cudaStreamSynchronize(stream);
      if (word != seq) {
        ++failures;
        std::printf("FUSED: completion word %llu, want %llu\n", (unsigned long long)word,
                    (unsigned long long)seq);
      }
      if (std::any_of(counters.begin(), counters.end(), [](uint32_t c) { return c != 0; })) {
        ++failures;
        std::printf("FUSED: a launch of %d tensors left a counter that is not zero\n", n);
      }
    }
  }
  if (rc != 0) {
    std::printf("%s launch failed: %s\n", kernel_name(g_kernel),
                cudaGetErrorString(cudaError_t(rc)));
    std::exit(1);
  }
}

// The reference: the host copy, in logical order.
lanes::LaneResult reference(const at::Tensor& t) {
  at::Tensor h = t.cpu().contiguous();
  DeviceDigester d(trace::Dtype(uint8_t(h.scalar_type())));
  d.update(h.data_ptr(), size_t(h.nbytes()));
  return d.finish();
}

int strided_checked = 0;

// t as the recorder hands it to the kernel: the fused kernel reads a view through its strides
// where device::strided_geometry says it can; anything else is made contiguous on the stream
// first. What the job reads goes to *held.
device::DigestJob job_of(const at::Tensor& t, std::vector<at::Tensor>* held) {
  device::DigestJob job{nullptr, uint64_t(t.numel()) * t.element_size(),
                        trace::Dtype(uint8_t(t.scalar_type()))};
  if (g_kernel == Kernel::kFused && !t.is_contiguous() && t.numel() > 0 &&
      device::strided_geometry(t.data_ptr(), t.element_size(), t.sizes().data(), t.strides().data(),
                               size_t(t.dim()), &job.geometry)) {
    job.strided = true;
    held->push_back(t);
    ++strided_checked;
  } else {
    held->push_back(t.contiguous());
  }
  job.data = held->back().data_ptr();
  return job;
}

std::vector<lanes::LaneResult> on_device(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> held;  // what the jobs read, alive until the stream is done
  std::vector<device::DigestJob> jobs;
  for (const at::Tensor& t : tensors) jobs.push_back(job_of(t, &held));
  const int n = int(jobs.size());
  auto opts = at::TensorOptions().dtype(at::kByte).device(tensors[0].device());
  at::Tensor scratch;
  at::Tensor results = at::empty({int64_t(n * sizeof(lanes::LaneResult))}, opts);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  launch(jobs, results.data_ptr(), stream, &scratch, /*check_fused=*/true);
  std::vector<lanes::LaneResult> out(static_cast<size_t>(n));
  cudaMemcpyAsync(out.data(), results.data_ptr(), out.size() * sizeof(lanes::LaneResult),
                  cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return out;
}

void expect_same(const std::string& what, const lanes::LaneResult& got,
                 const lanes::LaneResult& want) {
  if (got.root == want.root && std::memcmp(&got.stats, &want.stats, sizeof got.stats) == 0) return;
  ++failures;
  std::printf(
      "MISMATCH (%s) %s: root %016llx vs %016llx, sum %.17g vs %.17g, sumsq %.17g vs %.17g, "
      "min %g vs %g, max %g vs %g, count %llu vs %llu, nan %llu vs %llu, inf %llu vs %llu\n",
      kernel_name(g_kernel), what.c_str(), (unsigned long long)got.root,
      (unsigned long long)want.root, got.stats.sum, want.stats.sum, got.stats.sumsq,
      want.stats.sumsq, got.stats.min, want.stats.min, got.stats.max, want.stats.max,
      (unsigned long long)got.stats.count, (unsigned long long)want.stats.count,
      (unsigned long long)got.stats.nan, (unsigned long long)want.stats.nan,
      (unsigned long long)got.stats.inf, (unsigned long long)want.stats.inf);
}

// 100 batches submitted behind a long kernel: none may wait for the device.
void check_pipeline(const std::vector<at::Tensor>& tensors) {
  std::string error;
  auto queue = device::CudaQueue::create(128, g_kernel, &error);
  if (!queue) {
    ++failures;
    std::printf("CudaQueue: %s\n", error.c_str());
    return;
  }
  device::DigestPipeline pipeline(queue.get());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  std::vector<at::Tensor> held;
  for (const at::Tensor& t : tensors) held.push_back(t.contiguous());
  cudaStreamSynchronize(stream);
  at::cuda::sleep(int64_t(khz) * 200);  // about 200 ms
  std::vector<lanes::LaneResult> got(100);
  std::vector<bool> came(100, false);
  for (int i = 0; i < 100; ++i) {
    const at::Tensor& t = held[size_t(i) % held.size()];
    pipeline.submit({{t.data_ptr(), uint64_t(t.nbytes()), trace::Dtype(uint8_t(t.scalar_type()))}},
                    stream, [&got, &came, i](const lanes::LaneResult* r, int n) {
                      if (r && n == 1) {
                        got[size_t(i)] = r[0];
                        came[size_t(i)] = true;
                      }
                    });
  }
  const bool busy = cudaStreamQuery(stream) == cudaErrorNotReady;
  if (!busy || pipeline.ring_full_waits() != 0) {
    ++failures;
    std::printf("SYNC: after 100 submissions the stream is %s, ring-full waits %llu\n",
                busy ? "busy" : "idle (the host waited for it)",
                (unsigned long long)pipeline.ring_full_waits());
  }
  pipeline.drain();
  // Scratch from the slot's ring, results written where the host reads them: two kernels and
  // an event a launch (two-pass), or the one kernel (fused); no allocation and no copy.
  const double calls_per_launch = double(queue->device_calls()) / 100;
  const double want = g_kernel == Kernel::kFused ? 1 : 3;
  std::printf("CudaQueue (%s): %.2f CUDA calls per launch\n", kernel_name(g_kernel),
              calls_per_launch);
  if (calls_per_launch > want) {
    ++failures;
    std::printf("CALLS: %.2f CUDA calls per launch, want at most %.0f\n", calls_per_launch, want);
  }
  for (int i = 0; i < 100; ++i) {
    const at::Tensor& t = held[size_t(i) % held.size()];
    if (!came[size_t(i)]) {
      ++failures;
      std::printf("pipeline: batch %d never completed\n", i);
      continue;
    }
    expect_same("pipeline batch " + std::to_string(i), got[size_t(i)], reference(t));
  }
}

// Milliseconds per call of `enqueue` on the current stream: the median of 7, after a warm-up.
template <class F>
double time_ms(F enqueue) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  enqueue();
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    cudaEventRecord(start, stream);
    enqueue();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// GB/s of the digest of `tensors` (one launch, as the recorder batches them).
double digest_gbs(const std::vector<at::Tensor>& tensors) {
  std::vector<device::DigestJob> jobs;
  std::vector<at::Tensor> held;
  uint64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    jobs.push_back(job_of(t, &held));
    bytes += jobs.back().bytes;
  }
  const int n = int(jobs.size());
  auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  at::Tensor scratch;
  at::Tensor results = at::empty({int64_t(n * sizeof(lanes::LaneResult))}, opts);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const double ms = time_ms(
      [&] { launch(jobs, results.data_ptr(), stream, &scratch, /*check_fused=*/false); });
  return double(bytes) / (ms * 1e-3) / 1e9;
}

void report_throughput() {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor big = at::randn({int64_t(1) << 28}, cuda);  // 1 GiB of float32
  at::Tensor dst = at::empty_like(big);
  const double copy_ms = time_ms([&] { dst.copy_(big); });
  std::vector<at::Tensor> small;  // a full batch of activations of 64 KiB
  for (int i = 0; i < device::kMaxBatch; ++i) small.push_back(at::randn({16384}, cuda));
  std::vector<at::Tensor> tiny;  // a full batch of biases of 1 KiB
  for (int i = 0; i < device::kMaxBatch; ++i) tiny.push_back(at::randn({256}, cuda));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  g_kernel = Kernel::kTwoPass;
  const double two_pass[] = {digest_gbs({big}), digest_gbs(small), digest_gbs(tiny)};
  g_kernel = Kernel::kFused;
  const double fused[] = {digest_gbs({big}), digest_gbs(small), digest_gbs(tiny)};
  // A transposed 64 MiB matrix read through its strides, against making it contiguous.
  const at::Tensor square = at::randn({4096, 4096}, cuda);
  const double transposed_gbs = digest_gbs({square.t()});
  at::Tensor copy = at::empty_like(square);
  const double transpose_copy_ms = time_ms([&] { copy.copy_(square.t()); });
  std::printf(
      "THROUGHPUT {\"device\": \"%s\", \"digest_1gib_gbs\": %.1f, "
      "\"digest_batch_256x64kib_gbs\": %.2f, \"digest_batch_256x1kib_gbs\": %.3f, "
      "\"fused_1gib_gbs\": %.1f, \"fused_batch_256x64kib_gbs\": %.2f, "
      "\"fused_batch_256x1kib_gbs\": %.3f, \"fused_transposed_64mib_gbs\": %.1f, "
      "\"transposed_64mib_contiguous_copy_gbs\": %.1f, \"copy_1gib_read_write_gbs\": %.1f}\n",
      prop.name, two_pass[0], two_pass[1], two_pass[2], fused[0], fused[1], fused[2],
      transposed_gbs, double(square.nbytes()) / (transpose_copy_ms * 1e-3) / 1e9,
      2.0 * double(big.nbytes()) / (copy_ms * 1e-3) / 1e9);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: nothing checked\n");
    return 77;
  }
  for (Kernel kernel : {Kernel::kTwoPass, Kernel::kFused}) {
    g_kernel = kernel;
    at::manual_seed(0);
    const at::ScalarType dtypes[] = {
        at::kByte,  at::kChar,   at::kShort,        at::kInt,           at::kLong, at::kHalf,
        at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble, at::kBool, at::kBFloat16};
    const std::vector<std::vector<int64_t>> shapes = {
        {0}, {1}, {3}, {7, 3}, {1000}, {1025}, {4097}, {513, 7}, {(1 << 20) + 3}, {3, 1 << 19}};
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    int checked = 0;
    for (at::ScalarType dtype : dtypes) {
      const int64_t esize = int64_t(c10::elementSize(dtype));
      std::vector<at::Tensor> batch;
      for (const auto& shape : shapes) {
        int64_t numel = 1;
        for (int64_t s : shape) numel *= s;
        // Random bytes: every bit pattern, NaNs and Infs included (bool: 0 and 1 only).
        at::Tensor bytes = dtype == at::kBool
                               ? at::randint(0, 2, {numel}, cuda.dtype(at::kByte))
                               : at::randint(0, 256, {numel * esize}, cuda.dtype(at::kByte));
        at::Tensor t = (dtype == at::kBool ? bytes.to(at::kBool) : bytes.view(dtype)).view(shape);
        std::vector<std::pair<std::string, at::Tensor>> cases = {{"random bytes", t}};
        if (at::isFloatingType(dtype) || at::isComplexType(dtype))
          cases.push_back(
              {"finite values", (at::randn(shape, cuda.dtype(at::kDouble)) *
                                 at::exp2(at::randint(-10, 10, shape, cuda.dtype(at::kDouble))))
                                    .to(dtype)});
        // Contiguous, so read in place, from an address that is not 8-byte aligned.
        if (shape.size() == 1 && numel > 1)
          cases.push_back({"contiguous at an offset", t.slice(0, 1)});
        if (shape.size() == 2) {
          cases.push_back({"transposed", t.t()});
          cases.push_back({"sliced with an offset", t.slice(1, 1)});
          cases.push_back({"expanded", t.select(1, 0).unsqueeze(1).expand(shape)});
        }
        for (auto& [what, x] : cases) {
          const std::string name = std::string(c10::toString(dtype)) + " " + what + " " +
                                   c10::str(x.sizes());
          expect_same(name, on_device({x})[0], reference(x));
          ++checked;
          if (batch.size() < size_t(device::kMaxBatch)) batch.push_back(x);
        }
      }
      // One launch for many tensors gives each the result it gets alone.
      const auto together = on_device(batch);
      for (size_t i = 0; i < batch.size(); ++i)
        expect_same(
            std::string(c10::toString(dtype)) + " in a batch of " + std::to_string(batch.size()),
            together[i], reference(batch[i]));
    }
    // More than 256 groups of leaves: the tree's last block folds their entries in two rounds.
    const at::Tensor big = at::randn({(int64_t(1) << 26) + 5}, cuda);  // 256 MiB, 65,537 leaves
    expect_same("float 256 MiB + 20 bytes", on_device({big})[0], reference(big));
    ++checked;
    check_pipeline({at::randn({1000, 3}, cuda), at::randn({4097}, cuda).to(at::kHalf),
                    at::randint(0, 100, {70000}, cuda.dtype(at::kLong))});
    std::printf(
        "%s: %d tensors checked (%d read through their strides), then 100 batches through the "
        "pipeline; %d mismatches\n",
        kernel_name(kernel), checked, strided_checked, failures);
    if (kernel == Kernel::kFused && strided_checked == 0) {
      ++failures;
      std::printf("FUSED: no view was read through its strides\n");
    }
  }
  report_throughput();
  return failures ? 1 : 0;
}
