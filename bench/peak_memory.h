#pragma once
// Peak CPU memory of a piece of code, for the benchmarks: a c10::Allocator that wraps LibTorch's
// CPU allocator and counts the bytes of every tensor storage allocated through it (live and
// peak). Installed with c10::SetCPUAllocator; storages allocated before keep their own deleter and
// are not counted. oneDNN's own scratch buffers do not go through it either, so the figures are
// the tensors' bytes: activations saved for the backward, gradients, temporaries.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace whittle::bench {

/// Counting wrapper of the CPU allocator. One instance per process (install() once).
class PeakMemory final : public c10::Allocator {
 public:
  /// Puts the wrapper in front of the current CPU allocator (priority above the default one's).
  static PeakMemory& install() {
    static PeakMemory* self = [] {
      auto* p = new PeakMemory(c10::GetCPUAllocator());
      instance() = p;
      c10::SetCPUAllocator(p, /*priority=*/100);
      return p;
    }();
    return *self;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[data] = Block{std::move(inner), n};
    }
    const size_t now = live_.fetch_add(n) + n;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    // data as its own context, as raw_allocate() requires
    return {data, data, &PeakMemory::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PeakMemory::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  /// Bytes of the counted storages alive now.
  size_t live() const { return live_.load(); }
  /// Highest live() since the last reset_peak().
  size_t peak() const { return peak_.load(); }
  /// Starts a new peak from what is alive now.
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct Block {
    c10::DataPtr data;
    size_t bytes = 0;
  };
  explicit PeakMemory(c10::Allocator* inner) : inner_(inner) {}
  static PeakMemory*& instance() {
    static PeakMemory* self = nullptr;
    return self;
  }
  static void release(void* p) {
    if (!p) return;
    PeakMemory* self = instance();
    Block b;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->blocks_.find(p);
      if (it == self->blocks_.end()) return;
      b = std::move(it->second);
      self->blocks_.erase(it);
    }
    self->live_.fetch_sub(b.bytes);
  }  // b.data frees the memory through the wrapped allocator
  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::atomic<size_t> live_{0}, peak_{0};
};

}  // namespace whittle::bench
