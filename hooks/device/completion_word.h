// A launch's completion read from a word the kernel writes, not from an event: the kernel's last
// block stores the launch's sequence number into mapped pinned memory, after every result, and
// the collector polls it. No CUDA call a launch; a launch that faulted never writes it, so the
// waiter asks the device now and then. Torch-free and CUDA-free: the unit tests drive it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace detaudit::device {

// What the device says of the launch's stream while the word is still old.
enum class StreamState { kBusy, kIdle, kFailed };

// Waits until *word reaches `seq` (true), or until the stream failed, or went idle without the
// word arriving (false: the launch did not run to its end). `ask` is called at most every
// `ask_every` of waiting. Word: volatile uint64_t where the device writes it (mapped memory),
// std::atomic<uint64_t> where a test's thread does.
template <typename Word, typename Ask>
bool wait_for_word(const Word* word, uint64_t seq, Ask ask,
                   std::chrono::microseconds ask_every = std::chrono::milliseconds(5)) {
  using Clock = std::chrono::steady_clock;
  auto arrived = [&] {
    if (uint64_t(*word) < seq) return false;
    std::atomic_thread_fence(std::memory_order_acquire);  // the results after the word
    return true;
  };
  // A short spin: most launches are a few microseconds behind the op's thread.
  for (int i = 0; i < 256; ++i)
    if (arrived()) return true;
  auto pause = std::chrono::microseconds(2);
  auto next_ask = Clock::now() + ask_every;
  for (;;) {
    if (arrived()) return true;
    if (Clock::now() >= next_ask) {
      const StreamState s = ask();
      // Idle: the word may have come just before the stream emptied; read it once more.
      if (s != StreamState::kBusy) return arrived();
      next_ask = Clock::now() + ask_every;
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(100)) pause *= 2;
  }
}

}  // namespace detaudit::device
