// Describes one at::Tensor for the trace: dtype, device, shape, and a digest plus statistics of
// its logical contents (non-contiguous tensors in logical order, so layout never changes a digest).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>

#include "digest/digest.h"
#include "trace/format.h"

namespace detaudit::hooks {

// The trace's code for the tensor's dtype (c10::ScalarType's numbering, trace/dtype.h).
inline trace::Dtype dtype_of(const at::Tensor& t) { return trace::Dtype(uint8_t(t.scalar_type())); }

// Why a tensor cannot be hashed (sparse, quantized, meta, ...), or nullptr if it can.
const char* unhashable_reason(const at::Tensor& t);
inline constexpr const char* kNoDataReason = "no data (a fake tensor: torch.compile tracing)";
// Elements but no bytes: the FakeTensors that torch.compile traces with. An op on them computes
// nothing, and whether it runs depends on the compile cache, so it is not the program's.
bool has_no_data(const at::Tensor& t);

// dtype, device, sizes and strides (digest and statistics cleared), with no read of the data:
// what the empty family's uninitialized outputs are described by.
void describe_geometry(const at::Tensor& t, size_t digest_len, trace::TensorDesc* desc);

// Fills everything but the provenance bits. Returns the number of bytes hashed.
uint64_t describe_tensor(const at::Tensor& t, Hasher* hasher, bool with_stats,
                         trace::TensorDesc* desc);

// Work on torch's own intra-op threads, the program's choice of them: fn over [0, n) split
// across them by at::parallel_for, and how many the calling thread may use now (1 inside a
// parallel region, where parallel_for runs serially, and in a forked child).
void on_torch_pool(size_t n, const std::function<void(size_t, size_t)>& fn);
size_t torch_pool_threads();

// The .status line on large tensors' leaves: how many units of work ran on torch's intra-op
// threads other than the op's; "" when no tensor was large enough.
std::string torch_pool_status();
// A forked child's counters start from zero.
void forget_torch_pool_status();

// A 64-bit digest of a generator's full state (engine and cached normal samples).
uint64_t generator_digest(const at::Generator& gen);

}  // namespace detaudit::hooks
