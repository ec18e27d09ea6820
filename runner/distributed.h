#pragma once
// Data-parallel training over PyTorch's distributed engine, c10d (the TCPStore rendezvous,
// ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA, and DDP's Reducer), as LibTorch ships it.
// Processes are started by the launcher people already use (torchrun, a SLURM script): each reads
// its place from the environment (launch_from_environment), joins the group (ProcessGroup), and
// trains its shard of every epoch (data::LoaderOptions::num_replicas / rank, the distributed
// sampler) with gradients averaged across ranks (DistributedDataParallel). docs/distributed.md.
//
// c10d's own headers stay inside distributed.cpp: this header needs ATen and the standard library.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/functional.h"

namespace torch::nn {
class Module;
}

namespace whittle::runner {

/// Where this process stands in a launch, from the variables torchrun and SLURM-style launchers set.
struct LaunchInfo {
  int64_t rank = 0;                       ///< RANK: this process among all, 0-based
  int64_t world_size = 1;                 ///< WORLD_SIZE: processes in the job
  int64_t local_rank = 0;                 ///< LOCAL_RANK: among this machine's processes (its GPU index on CUDA)
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: host of the rendezvous store
  int port = 29500;                       ///< MASTER_PORT: its TCP port
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store and every rank is a client
  /// (else rank 0 hosts it).
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: torchrun's attempt (its store outlives a restart; whittle's keys
  /// are prefixed by it). 0 without torchrun.
  int64_t restart_count = 0;
};

/// The launch the environment describes, or nothing when WORLD_SIZE is unset or 1 (one process,
/// nothing to join). Throws whittle::Error (usage) naming the variable for WORLD_SIZE > 1 without
/// RANK or MASTER_PORT, a value that is not a whole number, RANK outside [0, WORLD_SIZE),
/// LOCAL_RANK < 0, or MASTER_PORT outside 1..65535.
std::optional<LaunchInfo> launch_from_environment();

/// Options of ProcessGroup::connect.
struct ProcessGroupOptions {
  std::string backend = "auto";  ///< "gloo", "nccl", or "auto": nccl when `device` is CUDA, else gloo
  at::Device device = at::kCPU;  ///< where the collectives' tensors live
  double timeout_seconds = 1800; ///< rendezvous and every collective fail after this long
};

/// A c10d process group: a TCPStore at MASTER_ADDR:MASTER_PORT (its keys prefixed per torchrun restart),
/// and ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA) over it. Every rank must call the
/// collectives in the same order with tensors of the same shapes and dtypes, on the group's device.
///
/// Failure: a rank that fails calls report_failure(message) before it exits; the others, waiting
/// in a collective, see it within about a second and throw whittle::Error carrying that message.
/// A rank that dies without a word (SIGKILL, out of memory) ends the others' collectives with
/// Gloo's connection error, or at the latest after timeout_seconds; they throw whittle::Error naming
/// the collective. Not thread-safe: one thread issues the collectives.
class ProcessGroup {
 public:
  /// Joins the group: the store (hosted by rank 0 unless torchrun's agent hosts it), then the
  /// backend's rendezvous with every rank. GLOO_SOCKET_IFNAME picks Gloo's network interfaces as in
  /// PyTorch. Throws whittle::Error (usage) for an unknown backend, or nccl on a CPU device or in a
  /// whittle built without CUDA; whittle::Error when the store or a rank cannot be reached within
  /// the timeout (naming MASTER_ADDR:MASTER_PORT). Sets SIGPIPE to ignored when it has its default
  /// action, so a write to a dead peer's socket is an error, not this process's end.
  static std::shared_ptr<ProcessGroup> connect(const LaunchInfo& launch, const ProcessGroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const;
  int64_t world_size() const;
  /// "gloo" or "nccl".
  const std::string& backend() const;
  const at::Device& device() const;

  /// Replaces each tensor by its sum over the ranks, in place.
  void all_reduce_sum(std::vector<at::Tensor>& tensors);
  /// The element-wise sum of `values` over the ranks (float64, the same length on every rank).
  std::vector<double> sum(const std::vector<double>& values);
  /// Copies rank `root`'s values into every rank's `tensors`, in place, flattened into one message
  /// per dtype (coalesced).
  void broadcast(std::vector<at::Tensor>& tensors, int64_t root = 0);
  /// Every rank's `value` (the same shape and dtype on each), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& value);
  /// True on every rank when `flag` is true on any of them (a one-element all-reduce).
  bool any(bool flag);
  /// Returns once every rank has called it; waits at most `timeout_seconds` (≤ 0: the group's).
  void barrier(double timeout_seconds = 0);

  /// Leaves `message` in the store for the other ranks, then waits up to a few seconds for each of
  /// them to read it (the store may live in this process). Never throws.
  void report_failure(const std::string& message) noexcept;
  /// True once a collective failed or was abandoned, this rank reported a failure, or
  /// mark_failed_together() was called: the group is not usable any more.
  bool broken() const;
  /// For a failure every rank found together (a non-finite loss decided with any()): each throws,
  /// and none needs to tell the others (report_failure).
  void mark_failed_together() noexcept;
  /// "rank R: message" of every rank that reported a failure ("" when none did, or when the store
  /// is out of reach). Never throws.
  std::string failures() noexcept;

  struct Impl;  ///< the c10d objects (distributed.cpp)
  Impl& impl() { return *impl_; }

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Options of DistributedDataParallel, as torch.nn.parallel.DistributedDataParallel's.
struct DataParallelOptions {
  double bucket_cap_mb = 25;            ///< gradients all-reduced in buckets of about this size (the first 1 MiB)
  bool find_unused_parameters = false;  ///< allow parameters that get no gradient in a backward pass
  bool broadcast_buffers = true;        ///< before each forward, rank 0's buffers are copied to every rank
  /// Batch norms of the training forward passes between before_forward() and backward()
  /// normalize with the statistics of the global batch (torch.nn.SyncBatchNorm;
  /// graph/functional.h CrossReplicaBatchNorm).
  bool sync_batchnorm = false;
};

/// Data parallelism with PyTorch DDP's semantics, on c10d's own Reducer. At construction the
/// parameters and buffers are broadcast from rank 0. Each synchronized backward pass all-reduces the
/// gradients in buckets (flattened; a bucket's all-reduce starts as soon as its last gradient is
/// accumulated, overlapping the rest of the backward pass) and leaves in every parameter's .grad
/// the average over the ranks. One step of a user's loop:
///
///     whittle::runner::DistributedDataParallel ddp(group, *model);
///     ddp.before_forward();                          // rank 0's buffers, the reducer armed
///     at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
///     ddp.backward(loss);                            // loss.backward(), then gradients averaged
///     optimizer.step();
///
/// Gradient accumulation: before_forward(false) for every micro-batch but the last, whose
/// backward then averages the accumulated sums (DDP's no_sync()). The parameters are fixed at
/// construction: after the model's parameter set changes (pruning), call set_parameters.
/// Throws whittle::Error from a failed collective (see ProcessGroup).
/// A ReplicaSum (graph/functional.h) over `group`'s ranks: sums a tensor in place (copied to the
/// group's device and back when it lives elsewhere). Holds the group weakly; throws whittle::Error
/// once it is gone.
ReplicaSum replica_sum(const std::shared_ptr<ProcessGroup>& group);

class DistributedDataParallel {
 public:
  /// Data parallelism over `parameters` (those requiring gradients take part) and `buffers`.
  DistributedDataParallel(std::shared_ptr<ProcessGroup> group, std::vector<at::Tensor> parameters,
                          std::vector<at::Tensor> buffers, DataParallelOptions options = {});
  /// Over a module's parameters and buffers (any torch::nn::Module, a GraphModule among them).
  DistributedDataParallel(std::shared_ptr<ProcessGroup> group, torch::nn::Module& module,
                          DataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Before a training forward pass: with broadcast_buffers, rank 0's buffers to every rank; when
  /// `sync_gradients`, the next backward() averages the gradients (else they only accumulate); with
  /// sync_batchnorm, batch norms on this thread use global batch statistics until backward().
  /// `with_buffers` false leaves out the buffers' broadcast (the caller did it already).
  void before_forward(bool sync_gradients = true, bool with_buffers = true);
  /// loss.backward(); when before_forward asked for it, every gradient is the average over ranks
  /// on return.
  void backward(const at::Tensor& loss);
  /// Rank 0's buffers to every rank (also before evaluation or a save, for one model everywhere).
  void broadcast_buffers();
  /// A new parameter and buffer set, after every rank made the same change to the model (not
  /// broadcast): rebuilds the reducer's buckets.
  void set_parameters(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers);
  /// Throws whittle::Error naming `when` and the first parameter (index, shape) whose bytes differ
  /// between ranks. Compares a 64-bit hash of each parameter across ranks.
  void verify_parameters_equal(const std::string& when);

  ProcessGroup& group() { return *group_; }

 private:
  struct State;
  [[noreturn]] void collective_failed(std::exception_ptr error);  // throws whittle::Error naming the failed rank
  std::shared_ptr<ProcessGroup> group_;
  DataParallelOptions options_;
  std::unique_ptr<CrossReplicaBatchNorm> sync_bn_;  // from before_forward to backward
  std::unique_ptr<State> state_;
};

}  // namespace whittle::runner
