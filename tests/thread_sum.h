#pragma once
// For tests of data-parallel code without processes: a sum over ranks run as threads.

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace whittle::test {

/// An in-memory sum over `replicas` threads: each call waits for the others' and returns the total
/// in place (every thread calls it with the same shapes in the same order), as a process group's
/// all-reduce does.
class ThreadSum {
 public:
  explicit ThreadSum(int replicas) : replicas_(replicas) {}
  void operator()(at::Tensor& values) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    total_ = arrived_ == 0 ? values.clone() : total_ + values;
    if (++arrived_ == replicas_) {
      result_ = total_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    values.copy_(result_);
  }

 private:
  int replicas_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t round_ = 0;
  at::Tensor total_, result_;
};

}  // namespace whittle::test
