// Which generator a random op draws from, decided from what its arguments are, without torch:
// the recorder digests that generator's state before the op runs, and the rule is unit-tested on
// machines without a GPU (tests/unit/cuda_state_test.cpp).
//
// - An explicit Generator argument is the op's generator.
// - Else a Device argument (factories, `*_like(..., device=)`) says where the op draws: the
//   default generator of that device.
// - Else the first tensor input on a CUDA device: a CUDA kernel (native_dropout, bernoulli_)
//   takes its seed and Philox offset from that device's default CUDA generator, never the CPU's.
// - Else the default CPU generator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace detaudit::hooks {

// One argument as far as the choice goes. Device types use c10::DeviceType numbering.
struct RngArg {
  enum class What : uint8_t { kOther, kGenerator, kTensor, kDevice };
  What what = What::kOther;
  int device_type = 0;    // kTensor, kDevice
  int device_index = -1;  // -1: the current device of that type
};

struct RngSource {
  enum class Kind : uint8_t { kExplicit, kCpu, kCuda };
  Kind kind = Kind::kCpu;
  size_t arg = 0;                // kExplicit: the argument that holds the Generator
  int device_index = -1;         // kCuda: -1 = the current CUDA device
  bool from_device_arg = false;  // kCuda: named by a Device argument, not by a tensor
};

inline constexpr int kCudaDeviceType = 1;  // c10::DeviceType::CUDA

// `describe(i)` returns the RngArg of argument i, for i < n.
template <typename Describe>
RngSource rng_source(size_t n, Describe describe) {
  std::optional<RngSource> device, cuda_tensor;
  for (size_t i = 0; i < n; ++i) {
    const RngArg a = describe(i);
    switch (a.what) {
      case RngArg::What::kGenerator: {
        RngSource s;
        s.kind = RngSource::Kind::kExplicit;
        s.arg = i;
        return s;
      }
      case RngArg::What::kDevice:
        if (!device) {
          device.emplace();
          device->kind = a.device_type == kCudaDeviceType ? RngSource::Kind::kCuda
                                                          : RngSource::Kind::kCpu;
          device->device_index = a.device_index;
          device->from_device_arg = true;
        }
        break;
      case RngArg::What::kTensor:
        if (!cuda_tensor && a.device_type == kCudaDeviceType) {
          cuda_tensor.emplace();
          cuda_tensor->kind = RngSource::Kind::kCuda;
          cuda_tensor->device_index = a.device_index;
        }
        break;
      case RngArg::What::kOther: break;
    }
  }
  return device ? *device : cuda_tensor ? *cuda_tensor : RngSource{};
}

}  // namespace detaudit::hooks
