// The MD5 batches' two slots and the process's digest thread (hooks/tensors/md5_batch_slots.h), without
// torch: every message's digest is the one TensorDigester gives its bytes, whichever thread ran its
// batch and however the op thread's calls interleave with it; run() leaves nothing pending; a stop
// signal's bounded run never blocks. Run under TSan by tests/tsan.sh.
#include "tensors/md5_batch_slots.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "digest/hashers.h"
#include "digest/md5_batch.h"
#include "digest/tensor_digester.h"

namespace detaudit {
namespace {

using hooks::Md5BatchSlots;
using hooks::PendingDigest;
using trace::TensorDesc;

struct Message {
  std::vector<uint8_t> bytes;
  trace::Dtype dtype;
  bool with_stats;
  std::shared_ptr<PendingDigest> digest;
};

// What the serial path writes for the message: the reference.
TensorDesc reference(const Message& m) {
  auto serially = [](size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); };
  Hasher h(trace::DigestAlgo::kMd5);
  TensorDigester d(&h, m.dtype, m.with_stats);
  d.update_all(m.bytes.data(), m.bytes.size(), serially);
  TensorDesc want;
  d.finish(&want);
  return want;
}

void expect_done_and_right(const std::vector<Message>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    ASSERT_TRUE(m.digest->done()) << "message " << i;
    TensorDesc got;
    m.digest->apply(&got);
    const TensorDesc want = reference(m);
    EXPECT_EQ(0, std::memcmp(want.digest.data(), got.digest.data(), 16)) << "message " << i;
    EXPECT_EQ(want.bits, got.bits) << "message " << i;
    EXPECT_EQ(0, std::memcmp(&want.stats, &got.stats, sizeof got.stats)) << "message " << i;
  }
}

Message add(Md5BatchSlots* slots, std::mt19937* rng, size_t n) {
  Message m;
  m.bytes.resize(n);
  for (uint8_t& b : m.bytes) b = uint8_t((*rng)());
  m.dtype = (*rng)() % 2 ? trace::Dtype::kFloat32 : trace::Dtype::kInt32;
  m.with_stats = (*rng)() % 4 != 0;
  std::memcpy(slots->reserve(n), m.bytes.data(), n);
  m.digest = slots->commit(m.dtype, m.with_stats);
  return m;
}

// Thousands of small messages (many full batches) and a few large ones, with hand-overs at random
// points and the op thread reading `done()` all along, as release_held does: every digest right.
TEST(Md5BatchSlotsTest, EveryDigestIsItsBytesWhicheverThreadRanTheBatch) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  std::mt19937 rng(7);
  Md5BatchSlots slots;
  std::vector<Message> messages;
  size_t seen_done = 0;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = i % 500 == 499 ? Md5Batch::kMaxTensorBytes : 1 + rng() % 5000;
    messages.push_back(add(&slots, &rng, n));
    if (rng() % 64 == 0) slots.submit_if_idle();
    while (seen_done < messages.size() && messages[seen_done].digest->done()) ++seen_done;
  }
  EXPECT_GT(seen_done, 0u) << "no batch completed while the op thread went on";
  EXPECT_FALSE(slots.empty());
  ASSERT_TRUE(slots.run());
  EXPECT_TRUE(slots.empty());
  expect_done_and_right(messages);
  // The status line counts batches run beside the op thread.
  const std::string status = hooks::md5_batch_status();
  EXPECT_NE(status.find("runs on the digest thread"), std::string::npos) << status;
  EXPECT_EQ(status.find(" 0 runs on the digest thread"), std::string::npos) << status;
}

// With several intra-op threads to use, a full batch runs on them at once, on the op's thread's
// call: its digests are done when the next tensor is added, and right, tensors of several leaves
// included. With one, the digest thread runs it, as before.
TEST(Md5BatchSlotsTest, AFullBatchRunsOnTheIntraOpThreadsWhenThereAreSeveral) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  size_t threads = 3, calls = 0;
  hooks::IntraOpThreads intra_op{[&](size_t n, const std::function<void(size_t, size_t)>& fn) {
                                   ++calls;
                                   std::vector<std::thread> pool;
                                   for (size_t t = 0; t < threads; ++t)
                                     if (n * t / threads < n * (t + 1) / threads)
                                       pool.emplace_back(fn, n * t / threads,
                                                         n * (t + 1) / threads);
                                   for (std::thread& t : pool) t.join();
                                 },
                                 [&] { return threads; }};
  Md5BatchSlots slots(intra_op);
  std::mt19937 rng(17);
  std::vector<Message> messages;
  for (int i = 0; i < 3 * int(Md5Batch::kMaxTensors); ++i) {
    const size_t n = i % 50 == 7 ? kLeafBytes * 2 + size_t(i) : 1 + rng() % 5000;
    messages.push_back(add(&slots, &rng, n));
  }
  ASSERT_GE(calls, 3u);
  size_t done = 0;
  while (done < messages.size() && messages[done].digest->done()) ++done;
  EXPECT_GE(done, 3 * Md5Batch::kMaxTensors - Md5Batch::kMaxTensors)
      << "the full batches' digests are done when the op's thread goes on";
  ASSERT_TRUE(slots.run());
  expect_done_and_right(messages);
  EXPECT_NE(hooks::md5_batch_status().find(" on the intra-op threads"), std::string::npos);

  threads = 1;
  const size_t calls_before = calls;
  std::vector<Message> alone;
  for (int i = 0; i < 2 * int(Md5Batch::kMaxTensors) + 3; ++i)
    alone.push_back(add(&slots, &rng, 1 + rng() % 5000));
  ASSERT_TRUE(slots.run());
  EXPECT_EQ(calls, calls_before) << "one intra-op thread: the batches go to the digest thread";
  expect_done_and_right(alone);
}

// A stop signal's handler waits a bounded time for the batch in flight: with batches of 1 MiB
// messages still hashing, run(0) comes back at once, and a later run() completes everything.
TEST(Md5BatchSlotsTest, ABoundedRunNeverBlocksAndAnUnboundedOneFinishes) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  std::mt19937 rng(11);
  Md5BatchSlots slots;
  std::vector<Message> messages;
  for (int i = 0; i < 7; ++i) messages.push_back(add(&slots, &rng, Md5Batch::kMaxTensorBytes));
  slots.submit_if_idle();
  for (int i = 0; i < 2; ++i) messages.push_back(add(&slots, &rng, 100));
  const auto start = std::chrono::steady_clock::now();
  const bool finished = slots.run(/*max_wait_ms=*/0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  if (finished) expect_done_and_right(messages);
  ASSERT_TRUE(slots.run());
  expect_done_and_right(messages);
}

// A forked child's slots forget the parent's messages and work alone afterwards.
TEST(Md5BatchSlotsTest, DiscardedSlotsStartAfresh) {
  if (!Md5Batch::available())
    GTEST_SKIP() << "no AVX-512F or AVX2 on this CPU: the batch is not used";
  std::mt19937 rng(13);
  Md5BatchSlots slots;
  std::vector<Message> before;
  for (int i = 0; i < 200; ++i) before.push_back(add(&slots, &rng, 3000));
  ASSERT_TRUE(slots.run());  // nothing in flight: a child forks between ops, not inside a batch
  for (int i = 0; i < 5; ++i) before.push_back(add(&slots, &rng, 64));
  slots.discard();
  EXPECT_TRUE(slots.empty());
  std::vector<Message> after;
  for (int i = 0; i < 300; ++i) after.push_back(add(&slots, &rng, 1 + rng() % 2000));
  ASSERT_TRUE(slots.run());
  expect_done_and_right(after);
}

}  // namespace
}  // namespace detaudit
