// Data-parallel QAT from your own LibTorch loop: every process trains DoReFa W4A4 LeNet-5 on its
// shard of the MNIST digits, with gradients averaged across processes (c10d: Gloo on CPU), and
// rank 0 saves the packed checkpoint. Launch it like any PyTorch job:
//   torchrun --no-python --nproc-per-node=2 ./train_ddp <mnist folder> [epochs=1] [out=lenet5_ddp.h5]
// or by hand, one process per rank:
//   WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train_ddp data/mnist10k &
//   WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train_ddp data/mnist10k
// Without those variables it trains alone.

#include <torch/optim/sgd.h>
#include <whittle/whittle.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: train_ddp <mnist folder> [epochs] [out.h5]\n";
    return 2;
  }
  const int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 1;
  const std::string out = argc > 3 ? argv[3] : "lenet5_ddp.h5";
  std::shared_ptr<whittle::runner::ProcessGroup> group;
  try {
    // The job's process group, when a launcher set WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT.
    if (auto launch = whittle::runner::launch_from_environment())
      group = whittle::runner::ProcessGroup::connect(*launch, {});
    const int64_t rank = group ? group->rank() : 0, ranks = group ? group->world_size() : 1;

    // The same model on every rank (DistributedDataParallel broadcasts rank 0's anyway).
    at::manual_seed(0);
    whittle::GraphModule model(whittle::build_model("lenet5"));
    whittle::quantize::Config config;
    config.method = "dorefa";
    config.weight_bits = config.activation_bits = 4;
    whittle::quantize::apply(model, config);
    std::unique_ptr<whittle::runner::DistributedDataParallel> ddp;
    if (group) ddp = std::make_unique<whittle::runner::DistributedDataParallel>(group, *model);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    // The distributed sampler: each rank a shard of every epoch, reshuffled each epoch.
    whittle::data::LoaderOptions lo;
    lo.batch_size = 64;
    lo.num_workers = 1;
    lo.transform.mean = {0.1307};
    lo.transform.stddev = {0.3081};
    lo.num_replicas = ranks;
    lo.rank = rank;
    whittle::data::DataLoader loader(whittle::data::load_mnist(argv[1], "train"), lo);

    model->train();
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      loader.set_epoch(epoch);
      double loss_sum = 0;
      for (const whittle::data::Batch& b : loader) {
        if (ddp) ddp->before_forward();
        at::Tensor loss = at::cross_entropy_loss(model->forward(b.images), b.labels);
        optimizer.zero_grad();
        if (ddp) ddp->backward(loss);  // gradients averaged over the ranks
        else loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>();
      }
      if (rank == 0)
        std::cout << "epoch " << epoch + 1 << ": mean loss " << loss_sum / static_cast<double>(loader.num_batches())
                  << " (" << ranks << " rank(s), " << loader.num_samples() << " images each)\n";
    }

    if (ddp) ddp->broadcast_buffers();  // rank 0's BN statistics everywhere: one model
    model->eval();
    at::NoGradGuard no_grad;
    whittle::data::Dataset test = whittle::data::load_mnist(argv[1], "t10k");
    at::Tensor x = (test.images.to(at::kFloat) / 255.0 - 0.1307) / 0.3081;
    const double top1 = model->forward(x).argmax(1).eq(test.labels).to(at::kDouble).mean().item<double>();
    if (rank == 0) {
      whittle::save_checkpoint(out, model->graph());
      std::cout << "test top-1 " << 100 * top1 << "% on " << test.size() << " images; saved " << out << " ("
                << whittle::file_size(out) << " bytes)\n";
    }
    if (group) group->barrier();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (group && !group->broken()) group->report_failure(e.what());  // the other ranks stop too
    return 1;
  }
}
