// Storage for weights the engine converts or repacks at load (q8 packed from a checkpoint, formats
// quantised on the fly). Large buffers are 2 MiB-aligned anonymous mappings advised for transparent
// huge pages, so a decode step streaming gigabytes of them needs a TLB entry per 2 MiB instead of per
// 4 KiB. Measured on Zen 4 (Linux with THP in "madvise" mode): one q8 stream of the E2B shape went from
// 84-90% to 94-101% of the bandwidth probe (then itself on 4 KiB pages), and q8 products of 8 tokens ran
// 3-20% faster. Weights used in place come from the checkpoint's map, which MappedFile advises the
// same way. Contents start unset: the loader writes every element.
#pragma once

#include <cstddef>
#include <memory>

namespace gemma4rt {

namespace detail {
// `count` elements of `element_bytes` each: a huge-page-advised mapping from 1 MiB up, plain aligned
// memory below. Throws Error, naming `what` the storage was for, when the system has no memory for it
// or the size does not fit in size_t.
void* allocate_weight_storage(size_t count, size_t element_bytes, const char* what);
void free_weight_storage(void* pointer, size_t bytes);
}  // namespace detail

template <class T>
class WeightBuffer {
 public:
  // Replaces the contents with `count` unset elements; `what` names the buffer in an out-of-memory error.
  void resize(size_t count, const char* what = "weights") {
    storage_.reset();
    size_ = 0;
    if (count == 0) return;
    storage_ = Storage(static_cast<T*>(detail::allocate_weight_storage(count, sizeof(T), what)), Free{count * sizeof(T)});
    size_ = count;
  }
  T* data() { return storage_.get(); }
  const T* data() const { return storage_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t index) { return storage_.get()[index]; }

 private:
  struct Free {
    size_t bytes = 0;
    void operator()(T* pointer) const { detail::free_weight_storage(pointer, bytes); }
  };
  using Storage = std::unique_ptr<T, Free>;
  Storage storage_{nullptr, Free{}};
  size_t size_ = 0;
};

}  // namespace gemma4rt
