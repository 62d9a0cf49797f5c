#include "util/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace detaudit {

Status for_each_parallel(size_t n, unsigned threads, const std::function<Status(size_t)>& work) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = unsigned(std::min<size_t>(threads, n));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto loop = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      Status s = work(i);
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (!failed.exchange(true)) first_error = s;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(loop);
  loop();
  for (std::thread& t : pool) t.join();
  return first_error;
}

}  // namespace detaudit
