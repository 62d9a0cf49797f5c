#include "md5_tensor_batch.h"

#include <atomic>
#include <cstring>

#include "digest/strided.h"
#include "trace/format.h"

namespace detaudit::hooks {

namespace {
std::atomic<uint64_t> g_runs{0}, g_tensors{0};
}  // namespace

std::string md5_batch_status() {
  const uint64_t runs = g_runs.load(std::memory_order_relaxed);
  if (runs == 0) return "";
  return "md5 batches: " + std::to_string(runs) + " runs, " +
         std::to_string(g_tensors.load(std::memory_order_relaxed)) + " tensors";
}

bool Md5TensorBatch::takes(const at::Tensor& t) {
  const size_t bytes = t.nbytes();
  return bytes > 0 && bytes <= Md5Batch::kMaxMessageBytes && t.is_cpu() && !t.is_conj() &&
         !t.is_neg() && (t.is_contiguous() || size_t(t.dim()) <= trace::Dims::kInline);
}

std::shared_ptr<PendingDigest> Md5TensorBatch::add(const at::Tensor& t, bool with_stats) {
  const size_t bytes = t.nbytes();
  if (!batch_.has_room(bytes)) run();
  uint8_t* out = batch_.reserve(bytes);
  if (t.is_contiguous()) {
    std::memcpy(out, t.data_ptr(), bytes);
  } else if (!gather_view(t.data_ptr(), size_t(t.element_size()), t.sizes().data(),
                          t.strides().data(), size_t(t.dim()), out, bytes)) {
    return nullptr;  // an element size the gather does not handle: nothing was committed
  }
  const uint8_t dtype = uint8_t(t.scalar_type());
  batch_.commit(dtype, with_stats);
  pending_.push_back(std::make_shared<PendingDigest>(dtype, with_stats));
  auto digest = pending_.back();
  if (batch_.full()) run();
  return digest;
}

void Md5TensorBatch::run() {
  if (pending_.empty()) return;
  batch_.run();
  g_runs.fetch_add(1, std::memory_order_relaxed);
  g_tensors.fetch_add(pending_.size(), std::memory_order_relaxed);
  for (size_t i = 0; i < pending_.size(); ++i) pending_[i]->complete(batch_.result(i));
  batch_.clear();
  pending_.clear();
}

void Md5TensorBatch::discard() {
  batch_.clear();
  pending_.clear();
}

}  // namespace detaudit::hooks
