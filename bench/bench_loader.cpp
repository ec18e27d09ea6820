// Loader throughput on CIFAR-10-sized data (3×32×32 uint8, batches of 128): images/s delivered by
// DataLoader with and without crop+flip, by the fused batch transform alone, and the decoding speed
// of an image folder. Items are images, so Google Benchmark's items_per_second is images/s.
//
// Synthetic random images stand in for CIFAR-10 by default. WHITTLE_CIFAR_JPEG_DIR=<folder>
// (e.g. the extracted cifar10-jpeg/train) also decodes that image folder and runs the loader on it.

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "data/image_folder.h"
#include "data/loader.h"
#include "data/transforms.h"

namespace {

using whittle::data::Dataset;

std::shared_ptr<const Dataset> synthetic_cifar(int64_t n) {
  auto d = std::make_shared<Dataset>();
  at::manual_seed(0);
  d->images = at::randint(0, 256, {n, 3, 32, 32}, at::kByte);
  d->labels = at::randint(0, 10, {n}, at::kLong);
  return d;
}

whittle::data::Transform cifar_transform(bool augment) {
  whittle::data::Transform t;
  if (augment) {
    t.padding = 4;
    t.flip_probability = 0.5;
  }
  t.mean = {0.4914, 0.4822, 0.4465};
  t.stddev = {0.2470, 0.2435, 0.2616};
  return t;
}

// One iteration = one epoch over the dataset; real time, since the work runs on worker threads.
void run_epochs(benchmark::State& state, const std::shared_ptr<const Dataset>& data, int workers, bool augment) {
  whittle::data::LoaderOptions o;
  o.batch_size = 128;
  o.shuffle = true;
  o.seed = 1;
  o.num_workers = workers;
  o.transform = cifar_transform(augment);
  whittle::data::DataLoader loader(data, o);
  int64_t images = 0, epoch = 0;
  for (auto _ : state) {
    loader.set_epoch(epoch++);
    for (const whittle::data::Batch& b : loader) {
      benchmark::DoNotOptimize(b.images.data_ptr<float>());
      images += b.images.size(0);
    }
  }
  state.SetItemsProcessed(images);
  state.counters["workers"] = workers;
}

// Args: num_workers, augment (0: normalize only; 1: pad-4 random crop + flip + normalize).
void BM_LoaderSyntheticCifar(benchmark::State& state) {
  static const auto data = synthetic_cifar(10000);
  run_epochs(state, data, static_cast<int>(state.range(0)), state.range(1) != 0);
}
BENCHMARK(BM_LoaderSyntheticCifar)
    ->ArgNames({"workers", "augment"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The fused gather + crop + flip + normalize kernel on one thread, batches of 128.
void BM_TransformBatch(benchmark::State& state) {
  static const auto data = synthetic_cifar(10000);
  const whittle::data::Transform t = cifar_transform(true);
  at::Tensor indices = at::randperm(10000, at::kLong).narrow(0, 0, 128).contiguous();
  at::Tensor out = at::empty({128, 3, 32, 32}, at::kFloat);
  whittle::data::Rng rng(7);
  for (auto _ : state) {
    whittle::data::transform_batch(data->images, indices, t, rng, out);
    benchmark::DoNotOptimize(out.data_ptr<float>());
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_TransformBatch)->Unit(benchmark::kMicrosecond);

const char* cifar_jpeg_dir() { return std::getenv("WHITTLE_CIFAR_JPEG_DIR"); }

// Decoding a whole JPEG image folder into memory with all cores (Arg: threads, 0 = all).
void BM_ImageFolderDecode(benchmark::State& state) {
  const char* dir = cifar_jpeg_dir();
  if (dir == nullptr) {
    state.SkipWithError("set WHITTLE_CIFAR_JPEG_DIR to an image folder, e.g. the extracted cifar10-jpeg/train");
    return;
  }
  whittle::data::ImageFolderOptions o;
  o.num_threads = static_cast<int>(state.range(0));
  int64_t images = 0;
  for (auto _ : state) images += whittle::data::read_image_folder(dir, o).size();
  state.SetItemsProcessed(images);
}
BENCHMARK(BM_ImageFolderDecode)->ArgName("threads")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// The loader on the decoded real images (Arg: num_workers), crop + flip + normalize.
void BM_LoaderCifarJpeg(benchmark::State& state) {
  const char* dir = cifar_jpeg_dir();
  if (dir == nullptr) {
    state.SkipWithError("set WHITTLE_CIFAR_JPEG_DIR to an image folder, e.g. the extracted cifar10-jpeg/train");
    return;
  }
  static const auto data = std::make_shared<const Dataset>(whittle::data::read_image_folder(dir));
  run_epochs(state, data, static_cast<int>(state.range(0)), true);
}
BENCHMARK(BM_LoaderCifarJpeg)->ArgName("workers")->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
