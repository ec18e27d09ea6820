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

namespace whittle::bench {

/// Counting wrapper of the CPU allocator. One instance per process (install() once).
class PeakMemory final : public c10::Allocator {
 public:
  /// Puts the wrapper in front of the current CPU allocator (priority above the default one's).
  static PeakMemory& install() {
    static PeakMemory* self = [] {
      auto* p = new PeakMemory(c10::GetCPUAllocator());
      c10::SetCPUAllocator(p, /*priority=*/100);
      return p;
    }();
    return *self;
  }

  c10::DataPtr allocate(size_t n) override {
    auto* ctx = new Block{inner_->allocate(n), n, this};
    const size_t now = live_.fetch_add(n) + n;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {ctx->data.get(), ctx, &PeakMemory::release, c10::Device(c10::kCPU)};
  }
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
    size_t bytes;
    PeakMemory* owner;
  };
  explicit PeakMemory(c10::Allocator* inner) : inner_(inner) {}
  static void release(void* p) {
    auto* b = static_cast<Block*>(p);
    b->owner->live_.fetch_sub(b->bytes);
    delete b;
  }
  c10::Allocator* inner_;
  std::atomic<size_t> live_{0}, peak_{0};
};

}  // namespace whittle::bench
