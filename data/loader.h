#pragma once
// DataLoader: shuffled, augmented, normalized float batches from an in-memory Dataset, built
// ahead of time on background worker threads, deterministic for a given seed.

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"

namespace whittle::data {

/// The most loader threads a DataLoader starts (more only contend for the cores and the memory).
inline constexpr int kMaxWorkers = 256;
/// The most batches a DataLoader prepares ahead of its consumer.
inline constexpr int kMaxPrefetchBatches = 4096;

/// Options of DataLoader.
struct LoaderOptions {
  int64_t batch_size = 128;
  /// Visit the samples in a new random order each epoch (else in dataset order).
  bool shuffle = true;
  /// Leave out the last batch when it would be smaller than batch_size.
  bool drop_last = false;
  /// Seeds the shuffle and the augmentation (see DataLoader).
  uint64_t seed = 0;
  /// Background threads building batches; 0 builds each batch in next() on the calling thread.
  int num_workers = 2;
  /// Batches built (or being built) ahead of the consumer; 0 = 2 × num_workers.
  int prefetch_batches = 0;
  /// Return batches in page-locked (pinned) host memory, for fast asynchronous copies to a GPU;
  /// only takes effect when a CUDA device is present (at::hasCUDA()).
  bool pin_memory = false;
  /// Crop, flip and normalization applied to each batch.
  Transform transform;
  /// Data-parallel sharding (the distributed sampler of runner/distributed.h): the epoch's order
  /// is split among `num_replicas` processes, this loader taking positions rank, rank + R,
  /// rank + 2R, ... of it (as torch.utils.data.DistributedSampler). 1 = no sharding.
  int64_t num_replicas = 1;
  /// This process's shard, in [0, num_replicas).
  int64_t rank = 0;
  /// With num_replicas > 1: every shard gets ⌈N / R⌉ samples, the order's first ones repeated to
  /// fill the last round, so that every process makes the same number of steps (training); false:
  /// the exact stride, shards differing by at most one sample, each sample seen once (evaluation).
  bool even_shards = true;
};

/// One batch of a DataLoader pass.
struct Batch {
  at::Tensor images;   ///< float32 [B, C, h, w], transformed and normalized
  at::Tensor labels;   ///< int64 [B]
  at::Tensor indices;  ///< int64 [B], the dataset indices of the samples
  int64_t epoch = 0;   ///< the epoch the batch belongs to
  int64_t index = 0;   ///< the batch index within the epoch, 0-based
};

/// Iterates over a Dataset in batches:
///
///     DataLoader loader(dataset, options);
///     for (int64_t epoch = 0; epoch < epochs; ++epoch) {
///       loader.set_epoch(epoch);
///       for (const Batch& batch : loader) { ... }
///     }
///
/// Determinism: epoch e's sample order is a Fisher–Yates shuffle driven by
/// Rng::stream(seed, e, kShuffleStream); batch b of epoch e takes positions [b·B, (b+1)·B) of that
/// order (of this process's shard of it, with num_replicas R > 1) and is augmented with its own
/// generator Rng::stream(seed, e, b·R + rank). A batch's content thus
/// depends only on (seed, epoch, batch index): the same seed gives the same batches in the same
/// order whatever num_workers and thread timing, distinct batches of an epoch never share a
/// generator, and epochs differ. If set_epoch is not called between two passes, the second pass
/// uses the next epoch number.
///
/// Worker threads build up to prefetch_batches batches ahead of the consumer; batches come out in
/// order. An error while building a batch is rethrown from the next() that would return it. The
/// loader keeps the dataset alive (shared); it is not meant for concurrent use by several consumers.
class DataLoader {
 public:
  /// Takes `dataset` (validated, see Dataset::validate) and checks the options against it.
  /// Throws whittle::Error for an invalid dataset, batch_size ≤ 0, num_replicas < 1 or rank outside
  /// [0, num_replicas), num_workers outside
  /// 0..kMaxWorkers, prefetch_batches outside 0..kMaxPrefetchBatches, a transform that does not
  /// fit the images, or a worker thread the system refuses to start (the ones started are stopped).
  DataLoader(Dataset dataset, LoaderOptions options);
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Sets the epoch of the next pass (begin() / start()).
  void set_epoch(int64_t epoch);
  /// The epoch of the current (or next) pass.
  int64_t epoch() const;
  /// Batches per epoch: ⌈S / batch_size⌉, or ⌊S / batch_size⌋ with drop_last, S = shard_size().
  int64_t num_batches() const { return num_batches_; }
  /// Samples per epoch: S, or num_batches() · batch_size with drop_last.
  int64_t num_samples() const { return num_samples_; }
  /// Samples of this process's shard of an epoch: N without sharding.
  int64_t shard_size() const { return shard_size_; }
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

  /// Epoch `epoch`'s order of the dataset indices (length N), the same in every process.
  std::vector<int64_t> permutation(int64_t epoch) const;
  /// This process's part of permutation(epoch) (length shard_size()), in the order it is visited;
  /// permutation(epoch) itself without sharding.
  std::vector<int64_t> shard(int64_t epoch) const;
  /// Builds batch `index` of `epoch` on the calling thread, exactly as a pass would return it.
  /// Thread-safe. Throws whittle::Error when index is outside [0, num_batches()).
  Batch batch(int64_t epoch, int64_t index) const;

  /// Begins a pass over the current epoch at batch `first_batch` (0 = the whole epoch; a later
  /// batch resumes an interrupted epoch), abandoning a pass in progress. Throws whittle::Error
  /// when first_batch is outside [0, num_batches()].
  void start(int64_t first_batch = 0);
  /// The next batch of the current pass, or nothing when the pass is over (or none was started).
  std::optional<Batch> next();

  /// Input iterator over one pass; begin() calls start().
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    Iterator() = default;
    explicit Iterator(DataLoader* loader) : loader_(loader) { advance(); }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      advance();
      return *this;
    }
    bool operator==(const Iterator& other) const { return current_.has_value() == other.current_.has_value(); }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    void advance() {
      current_ = loader_ ? loader_->next() : std::nullopt;
      if (!current_) loader_ = nullptr;
    }
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  /// Starts a pass (start()) and returns its first batch.
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  Batch make_batch(int64_t epoch, const std::vector<int64_t>& order, int64_t index) const;
  std::shared_ptr<const std::vector<int64_t>> order_for(int64_t epoch) const;
  void worker_loop();
  void stop_workers();  // asks the workers to stop and joins them

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  int64_t num_batches_ = 0;
  int64_t num_samples_ = 0;
  int64_t shard_size_ = 0;
  int prefetch_ = 0;
  bool pin_ = false;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // workers: a batch may be claimed, or stop
  std::condition_variable ready_cv_;  // consumer: a slot was filled
  bool stop_ = false;
  bool active_ = false;
  bool epoch_set_ = false;
  int64_t passes_ = 0;
  int64_t epoch_ = 0;
  int64_t pass_epoch_ = 0;
  uint64_t generation_ = 0;
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t next_claim_ = 0;
  int64_t next_consume_ = 0;
  std::map<int64_t, Slot> slots_;
  std::vector<std::thread> workers_;
  // The last permutation computed, reused by batch() and start() for the same epoch.
  mutable std::mutex order_cache_mutex_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> cached_order_;
};

}  // namespace whittle::data
