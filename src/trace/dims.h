// Sizes or strides of a tensor: up to kInline dimensions live inline, so describing and copying
// a tensor description allocates nothing on the recorder's op path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

namespace detaudit::trace {

class Dims {
 public:
  static constexpr size_t kInline = 6;

  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  Dims(const Dims& other) { assign(other.begin(), other.end()); }
  Dims& operator=(const Dims& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Dims& operator=(std::initializer_list<int64_t> v) {
    assign(v.begin(), v.end());
    return *this;
  }

  template <typename It>
  void assign(It first, It last) {
    resize(size_t(std::distance(first, last)));
    std::copy(first, last, data());
  }
  // Keeps the first min(size(), n) values, like std::vector::resize.
  void resize(size_t n) {
    const size_t keep = std::min(n_, n);
    if (n > kInline && n > heap_size_) {
      auto bigger = std::make_unique<int64_t[]>(n);
      std::copy(data(), data() + keep, bigger.get());
      heap_ = std::move(bigger);
      heap_size_ = n;
    } else if (n > kInline && n_ <= kInline) {
      std::copy(inline_, inline_ + keep, heap_.get());
    } else if (n <= kInline && n_ > kInline) {
      std::copy(heap_.get(), heap_.get() + keep, inline_);
    }
    n_ = n;
  }
  void clear() { n_ = 0; }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t* data() { return n_ > kInline ? heap_.get() : inline_; }
  const int64_t* data() const { return n_ > kInline ? heap_.get() : inline_; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + n_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + n_; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& operator[](size_t i) { return data()[i]; }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }

  bool operator==(const Dims& other) const {
    return std::equal(begin(), end(), other.begin(), other.end());
  }
  bool operator!=(const Dims& other) const { return !(*this == other); }

 private:
  size_t n_ = 0;
  int64_t inline_[kInline] = {};
  size_t heap_size_ = 0;
  std::unique_ptr<int64_t[]> heap_;  // when more than kInline dimensions
};

}  // namespace detaudit::trace
