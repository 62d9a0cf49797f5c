#include "device/host_queue.h"

#include <chrono>
#include <thread>

#include "digest/device_digest.h"
#include "digest/strided.h"

namespace detaudit::device {

bool HostQueue::enqueue(const DigestJob* jobs, int n, void*, int slot) {
  // What CudaQueue would call for this launch, so that the host queue's figures show it.
  calls_ += uint64_t(CudaQueue::calls_for(kernel_, jobs, n));
  for (int j = 0; j < n; ++j) {
    const DigestJob& job = jobs[j];
    DeviceDigester d(job.dtype);
    if (job.strided) {
      // The logical bytes, as the kernel gathers them.
      staging_.resize(job.bytes);
      const JobGeometry& g = job.geometry;
      if (!gather_view(job.data, g.elem_size, g.sizes, g.strides, g.dims, staging_.data(),
                       staging_.size()))
        return false;
      d.update(staging_.data(), job.bytes);
    } else {
      d.update(job.data, job.bytes);
    }
    results_[size_t(slot)][size_t(j)] = d.finish();
  }
  return true;
}

bool HostQueue::wait(int) {
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  return true;
}

}  // namespace detaudit::device
