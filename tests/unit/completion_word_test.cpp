// The fused device digest's completion on the host (hooks/device/completion_word.h): a word the
// kernel's last block writes, polled, with the device asked when it is late; and the CUDA calls
// a launch makes, one in steady state (hooks/device/cuda_queue.h). The kernel itself runs on a
// GPU (tests/gpu/).
#include "device/completion_word.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "device/cuda_queue.h"

namespace detaudit::device {
namespace {

using std::chrono::milliseconds;

TEST(CompletionWordTest, ReturnsOnceTheWordReachesTheLaunchsNumberWithoutAskingWhenOnTime) {
  std::atomic<uint64_t> word{6};
  int asked = 0;
  auto ask = [&] {
    ++asked;
    return StreamState::kBusy;
  };
  EXPECT_TRUE(wait_for_word(&word, 6, ask));  // already there
  std::thread kernel([&] {
    std::this_thread::sleep_for(milliseconds(2));
    word = 7;
  });
  EXPECT_TRUE(wait_for_word(&word, 7, ask, milliseconds(500)));
  kernel.join();
  EXPECT_EQ(asked, 0);
}

TEST(CompletionWordTest, ALateWordIsWaitedForWhileTheStreamIsBusy) {
  std::atomic<uint64_t> word{0};
  std::atomic<int> asked{0};
  std::thread kernel([&] {
    std::this_thread::sleep_for(milliseconds(30));
    word = 1;
  });
  EXPECT_TRUE(wait_for_word(
      &word, 1,
      [&] {
        ++asked;
        return StreamState::kBusy;
      },
      milliseconds(2)));
  kernel.join();
  EXPECT_GT(asked.load(), 1);
}

TEST(CompletionWordTest, AFailedOrIdleStreamWithoutTheWordIsAFailedLaunch) {
  std::atomic<uint64_t> word{3};
  EXPECT_FALSE(wait_for_word(
      &word, 4, [] { return StreamState::kFailed; }, milliseconds(1)));
  EXPECT_FALSE(wait_for_word(
      &word, 4, [] { return StreamState::kIdle; }, milliseconds(1)));
  // The word came just before the stream emptied: read once more, a success.
  int asks = 0;
  EXPECT_TRUE(wait_for_word(
      &word, 4,
      [&] {
        if (++asks == 2) word = 4;
        return asks == 2 ? StreamState::kIdle : StreamState::kBusy;
      },
      milliseconds(1)));
}

TEST(CompletionWordTest, AFusedLaunchIsOneCudaCallUnlessItsScratchOutgrowsTheSlot) {
  std::vector<DigestJob> small(kMaxBatch, DigestJob{nullptr, 4096, trace::Dtype::kUInt8});
  EXPECT_EQ(CudaQueue::calls_for(CudaQueue::Kernel::kFused, small.data(), kMaxBatch), 1);
  // The two-pass kernels: the leaf and group kernels and the event.
  EXPECT_EQ(CudaQueue::calls_for(CudaQueue::Kernel::kTwoPass, small.data(), kMaxBatch), 3);
  // 1 GiB: 1,024 groups of 256 leaves, 64 KiB of group entries, in the slot's scratch.
  const DigestJob gib{nullptr, uint64_t(1) << 30, trace::Dtype::kUInt8};
  EXPECT_LE(fused_scratch_bytes(&gib, 1), CudaQueue::kSlotScratchBytes);
  EXPECT_EQ(CudaQueue::calls_for(CudaQueue::Kernel::kFused, &gib, 1), 1);
  EXPECT_EQ(CudaQueue::calls_for(CudaQueue::Kernel::kTwoPass, &gib, 1), 5);
  // 8 GiB: its own scratch, zeroed counters, freed: three more calls.
  const DigestJob huge{nullptr, uint64_t(8) << 30, trace::Dtype::kUInt8};
  EXPECT_GT(fused_scratch_bytes(&huge, 1), CudaQueue::kSlotScratchBytes);
  EXPECT_EQ(CudaQueue::calls_for(CudaQueue::Kernel::kFused, &huge, 1), 4);
}

}  // namespace
}  // namespace detaudit::device
