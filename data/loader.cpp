#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <system_error>

#include "data/rng.h"
#include "core/error.h"

namespace whittle::data {

DataLoader::DataLoader(Dataset dataset, LoaderOptions options)
    : DataLoader(std::make_shared<const Dataset>(std::move(dataset)), std::move(options)) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  if (!dataset_) throw Error("DataLoader: no dataset");
  dataset_->validate("DataLoader");
  if (!dataset_->labels.is_contiguous()) {  // batches index the labels through a raw pointer
    auto copy = std::make_shared<Dataset>(*dataset_);
    copy->labels = copy->labels.contiguous();
    dataset_ = std::move(copy);
  }
  if (options_.batch_size <= 0)
    throw Error("DataLoader: batch_size must be > 0, got " + std::to_string(options_.batch_size));
  if (options_.num_workers < 0 || options_.num_workers > kMaxWorkers)
    throw Error("DataLoader: num_workers must be 0.." + std::to_string(kMaxWorkers) + ", got " +
                std::to_string(options_.num_workers));
  if (options_.prefetch_batches < 0 || options_.prefetch_batches > kMaxPrefetchBatches)
    throw Error("DataLoader: prefetch_batches must be 0.." + std::to_string(kMaxPrefetchBatches) + ", got " +
                std::to_string(options_.prefetch_batches));
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas)
    throw Error("DataLoader: rank " + std::to_string(options_.rank) + " of " + std::to_string(options_.num_replicas) +
                " replicas: num_replicas must be ≥ 1 and rank in [0, num_replicas)");
  options_.transform.validate(dataset_->channels(), dataset_->height(), dataset_->width());
  const int64_t replicas = options_.num_replicas;
  const int64_t all = dataset_->size();
  shard_size_ = replicas == 1          ? all
                : options_.even_shards ? (all + replicas - 1) / replicas
                                       : (all - options_.rank + replicas - 1) / replicas;
  const int64_t n = shard_size_;
  num_batches_ = n / options_.batch_size + (!options_.drop_last && n % options_.batch_size != 0 ? 1 : 0);
  num_samples_ = options_.drop_last ? num_batches_ * options_.batch_size : n;
  prefetch_ = options_.prefetch_batches > 0 ? options_.prefetch_batches : 2 * options_.num_workers;
  pin_ = options_.pin_memory && at::hasCUDA();
  for (int w = 0; w < options_.num_workers; ++w) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {
      stop_workers();
      throw Error("DataLoader: could not start loader thread " + std::to_string(w + 1) + " of " +
                  std::to_string(options_.num_workers) + " (" + e.what() + "); use fewer num_workers");
    }
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::set_epoch(int64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  epoch_ = epoch;
  epoch_set_ = true;
}

int64_t DataLoader::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

std::vector<int64_t> DataLoader::permutation(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_->size()));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    Rng rng = Rng::stream(options_.seed, static_cast<uint64_t>(epoch), kShuffleStream);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.uniform_int(i)]);
  }
  return order;
}

std::vector<int64_t> DataLoader::shard(int64_t epoch) const {
  std::vector<int64_t> order = permutation(epoch);
  const int64_t replicas = options_.num_replicas;
  if (replicas == 1 || order.empty()) return order;
  // Position rank + j·R of the order, the order repeated from its start past its end (even shards).
  std::vector<int64_t> mine(static_cast<size_t>(shard_size_));
  const auto n = static_cast<int64_t>(order.size());
  for (int64_t j = 0; j < shard_size_; ++j) mine[static_cast<size_t>(j)] = order[static_cast<size_t>((options_.rank + j * replicas) % n)];
  return mine;
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::order_for(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(order_cache_mutex_);
    if (cached_order_ && cached_epoch_ == epoch) return cached_order_;
  }
  auto order = std::make_shared<const std::vector<int64_t>>(shard(epoch));
  std::lock_guard<std::mutex> lock(order_cache_mutex_);
  cached_epoch_ = epoch;
  cached_order_ = order;
  return order;
}

Batch DataLoader::make_batch(int64_t epoch, const std::vector<int64_t>& order, int64_t index) const {
  const int64_t lo = index * options_.batch_size;
  const int64_t hi = std::min(lo + options_.batch_size, num_samples_);
  const int64_t b = hi - lo;
  const Dataset& d = *dataset_;
  Batch out;
  out.epoch = epoch;
  out.index = index;
  out.indices = at::empty({b}, at::kLong);
  out.labels = at::empty({b}, at::TensorOptions().dtype(at::kLong).pinned_memory(pin_));
  int64_t* ip = out.indices.data_ptr<int64_t>();
  int64_t* lp = out.labels.data_ptr<int64_t>();
  const int64_t* all_labels = d.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    ip[i] = order[static_cast<size_t>(lo + i)];
    lp[i] = all_labels[ip[i]];
  }
  const Transform& t = options_.transform;
  at::Tensor images = at::empty({b, d.channels(), t.out_height(d.height()), t.out_width(d.width())},
                                at::TensorOptions().dtype(at::kFloat).pinned_memory(pin_));
  Rng rng = Rng::stream(options_.seed, static_cast<uint64_t>(epoch),
                        static_cast<uint64_t>(index * options_.num_replicas + options_.rank));
  out.images = transform_batch(d.images, out.indices, t, rng, images);
  return out;
}

Batch DataLoader::batch(int64_t epoch, int64_t index) const {
  if (index < 0 || index >= num_batches_)
    throw Error("DataLoader: batch index " + std::to_string(index) + " is outside [0, " + std::to_string(num_batches_) +
                ")");
  return make_batch(epoch, *order_for(epoch), index);
}

void DataLoader::start(int64_t first_batch) {
  if (first_batch < 0 || first_batch > num_batches_)
    throw Error("DataLoader: first batch " + std::to_string(first_batch) + " is outside [0, " +
                std::to_string(num_batches_) + "]");
  std::unique_lock<std::mutex> lock(mutex_);
  if (passes_ > 0 && !epoch_set_) ++epoch_;
  epoch_set_ = false;
  ++passes_;
  ++generation_;  // batches of an abandoned pass still being built are dropped
  active_ = false;
  const int64_t e = epoch_;
  lock.unlock();
  auto order = order_for(e);
  lock.lock();
  order_ = std::move(order);
  pass_epoch_ = e;
  next_claim_ = first_batch;
  next_consume_ = first_batch;
  slots_.clear();
  active_ = true;
  lock.unlock();
  work_cv_.notify_all();
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!active_) return std::nullopt;
  if (next_consume_ >= num_batches_) {
    active_ = false;
    return std::nullopt;
  }
  const int64_t b = next_consume_;
  if (workers_.empty()) {
    ++next_consume_;
    const int64_t e = pass_epoch_;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lock.unlock();
    return make_batch(e, *order, b);
  }
  ready_cv_.wait(lock, [&] { return slots_.count(b) > 0; });
  Slot slot = std::move(slots_[b]);
  slots_.erase(b);
  ++next_consume_;
  if (slot.error) active_ = false;
  lock.unlock();
  work_cv_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

DataLoader::Iterator DataLoader::begin() {
  start();
  return Iterator(this);
}

void DataLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (active_ && next_claim_ < num_batches_ && next_claim_ < next_consume_ + prefetch_);
    });
    if (stop_) return;
    const int64_t b = next_claim_++;
    const uint64_t generation = generation_;
    const int64_t e = pass_epoch_;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lock.unlock();
    Slot slot;
    try {
      slot.batch = make_batch(e, *order, b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.lock();
    if (generation == generation_) {
      slots_[b] = std::move(slot);
      ready_cv_.notify_all();
    } else {
      lock.unlock();
      slot = Slot();  // a stale batch of an abandoned pass: free it outside the lock
      lock.lock();
    }
  }
}

}  // namespace whittle::data
