// The host queue (hooks/device/host_queue.h), which stands in for a GPU in the recorder's tests:
// each job's digest is the device digest's reference over its logical bytes, a strided view's
// gathered as the fused kernel reads it, and it counts the CUDA calls CudaQueue would make.
#include "device/host_queue.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "digest/device_digest.h"

namespace detaudit::device {
namespace {

constexpr trace::Dtype kFloat32 = trace::Dtype::kFloat32;

lanes::LaneResult reference(const std::vector<float>& logical) {
  DeviceDigester d(kFloat32);
  d.update(logical.data(), logical.size() * sizeof(float));
  return d.finish();
}

TEST(HostQueueTest, EachJobIsTheDeviceDigestOfItsLogicalBytes) {
  // A 3x4 matrix and its transpose as a view (strides 1, 4): the view's logical bytes are the
  // transpose's, read in place by the fused kernel.
  std::vector<float> m(12);
  for (size_t i = 0; i < m.size(); ++i) m[i] = float(i) * 0.5f - 1.0f;
  std::vector<float> transposed;
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 3; ++r) transposed.push_back(m[size_t(r * 4 + c)]);

  DigestJob jobs[2];
  jobs[0] = {m.data(), m.size() * sizeof(float), kFloat32};
  jobs[1] = {m.data(), m.size() * sizeof(float), kFloat32, /*strided=*/true};
  jobs[1].geometry.dims = 2;
  jobs[1].geometry.elem_size = sizeof(float);
  jobs[1].geometry.sizes[0] = 4;
  jobs[1].geometry.sizes[1] = 3;
  jobs[1].geometry.strides[0] = 1;
  jobs[1].geometry.strides[1] = 4;

  HostQueue queue(CudaQueue::Kernel::kFused);
  EXPECT_TRUE(queue.reads_strided());
  ASSERT_TRUE(queue.enqueue(jobs, 2, nullptr, 1));
  ASSERT_TRUE(queue.wait(1));
  const lanes::LaneResult* got = queue.results(1);
  const lanes::LaneResult want_plain = reference(m), want_view = reference(transposed);
  EXPECT_EQ(got[0].root, want_plain.root);
  EXPECT_EQ(got[1].root, want_view.root);
  EXPECT_NE(got[0].root, got[1].root);  // the same bytes in another order
  EXPECT_EQ(std::memcmp(&got[1].stats, &want_view.stats, sizeof(want_view.stats)), 0);
  EXPECT_EQ(queue.device_calls(),
            uint64_t(CudaQueue::calls_for(CudaQueue::Kernel::kFused, jobs, 2)));
}

TEST(HostQueueTest, TheTwoPassKernelsQueueTakesContiguousJobsAndCountsItsCalls) {
  std::vector<float> v(1000, 0.25f);
  DigestJob job = {v.data(), v.size() * sizeof(float), kFloat32};
  HostQueue queue(CudaQueue::Kernel::kTwoPass);
  EXPECT_FALSE(queue.reads_strided());
  for (int slot = 0; slot < queue.slots(); ++slot)
    ASSERT_TRUE(queue.enqueue(&job, 1, nullptr, slot));
  EXPECT_EQ(queue.results(3)[0].root, reference(v).root);
  EXPECT_EQ(queue.device_calls(),
            uint64_t(queue.slots()) *
                uint64_t(CudaQueue::calls_for(CudaQueue::Kernel::kTwoPass, &job, 1)));
}

}  // namespace
}  // namespace detaudit::device
