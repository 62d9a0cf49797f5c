// The reference for strided views in the digest tests: a view's elements copied one by one in
// logical (row-major) order, what its digest must equal however the code under test gathers it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace detaudit {

inline std::vector<uint8_t> logical_bytes(const std::vector<uint8_t>& base, size_t esize,
                                          const std::vector<int64_t>& sizes,
                                          const std::vector<int64_t>& strides, int64_t offset) {
  std::vector<uint8_t> logical;
  std::vector<int64_t> index(sizes.size(), 0);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  for (int64_t e = 0; e < numel; ++e) {
    int64_t off = offset;
    for (size_t d = 0; d < index.size(); ++d) off += index[d] * strides[d];
    const uint8_t* p = base.data() + off * int64_t(esize);
    logical.insert(logical.end(), p, p + esize);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
  return logical;
}

}  // namespace detaudit
