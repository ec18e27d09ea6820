#include "runner/distributed.h"

// LibTorch's wheel ships c10d's headers but not Gloo's; Debian's libgloo-dev provides those. Only
// types behind pointers come from them here, and nothing of Gloo is compiled into whittle: the
// implementation is the one inside libtorch_cpu.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#if defined(WHITTLE_WITH_CUDA) && defined(WHITTLE_WITH_NCCL)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <torch/nn/module.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace whittle::runner {

namespace {

using Clock = std::chrono::steady_clock;

// Environment variable `name` as a whole number; nothing when unset. Throws for another value.
std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  const std::string s(v);
  size_t used = 0;
  int64_t out = 0;
  try {
    out = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size())
    throw Error(std::string("environment variable ") + name + "='" + s + "' is not a whole number", ErrorKind::kUsage);
  return out;
}

std::string what_of(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  }
  return "unknown error";
}

// The first line of a c10d message (its later lines are C++ frames).
std::string first_line(std::string s) {
  const size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// "30", "0.5": seconds for messages.
std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace

std::optional<LaunchInfo> launch_from_environment() {
  const std::optional<int64_t> world = env_int("WORLD_SIZE");
  if (!world || *world == 1) return std::nullopt;
  if (*world < 1) throw Error("environment variable WORLD_SIZE=" + std::to_string(*world) + " must be ≥ 1", ErrorKind::kUsage);
  LaunchInfo l;
  l.world_size = *world;
  const std::optional<int64_t> rank = env_int("RANK");
  if (!rank)
    throw Error("WORLD_SIZE=" + std::to_string(l.world_size) + " is set but RANK is not: a launcher (torchrun, srun) sets both",
                ErrorKind::kUsage);
  if (*rank < 0 || *rank >= l.world_size)
    throw Error("RANK=" + std::to_string(*rank) + " is outside [0, WORLD_SIZE=" + std::to_string(l.world_size) + ")",
                ErrorKind::kUsage);
  l.rank = *rank;
  l.local_rank = env_int("LOCAL_RANK").value_or(0);
  if (l.local_rank < 0) throw Error("LOCAL_RANK=" + std::to_string(l.local_rank) + " must be ≥ 0", ErrorKind::kUsage);
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr)
    throw Error("WORLD_SIZE=" + std::to_string(l.world_size) + " is set but MASTER_ADDR is not (the host of rank 0 or of torchrun's store)",
                ErrorKind::kUsage);
  l.master_addr = addr;
  const std::optional<int64_t> port = env_int("MASTER_PORT");
  if (!port)
    throw Error("WORLD_SIZE=" + std::to_string(l.world_size) + " is set but MASTER_PORT is not", ErrorKind::kUsage);
  if (*port < 1 || *port > 65535)
    throw Error("MASTER_PORT=" + std::to_string(*port) + " is outside 1..65535", ErrorKind::kUsage);
  l.port = static_cast<int>(*port);
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  l.agent_store = agent && std::string(agent) == "True";
  l.restart_count = env_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  return l;
}

// ---------------------------------------------------------------- ProcessGroup

struct ProcessGroup::Impl {
  LaunchInfo launch;
  std::string backend;
  at::Device device = at::kCPU;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;       // whittle's keys (failures) on the job's store
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  bool poisoned = false;                       // a collective was abandoned: do not join c10d's threads
  std::vector<bool> acknowledged;              // failures of these ranks were already acknowledged

  ~Impl() {
    if (!poisoned) return;
    // A collective still in flight holds c10d's worker thread: destroying the group would wait for
    // it until the timeout. The process is about to exit; the objects are left to it, kept
    // reachable from a list that is never destroyed (so that leak checkers see them owned).
    static auto* abandoned_groups = new std::vector<c10::intrusive_ptr<c10d::ProcessGroup>>();
    static auto* abandoned_stores = new std::vector<c10::intrusive_ptr<c10d::Store>>();
    abandoned_groups->push_back(std::move(pg));
    abandoned_stores->push_back(std::move(store));
  }

  // Waits for `work`, every second looking for a failure another rank reported. Throws
  // whittle::Error naming `what` when the collective fails, times out, or a rank reported failure.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what, ProcessGroup& self,
            std::chrono::milliseconds limit = std::chrono::milliseconds(0)) {
    if (limit.count() <= 0) limit = timeout;
    const auto start = Clock::now();
    auto next_look = start + std::chrono::seconds(1);
    try {
      if (backend == "gloo") {
        auto pause = std::chrono::microseconds(20);
        while (!work->isCompleted()) {
          std::this_thread::sleep_for(pause);
          pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(2000));
          const auto now = Clock::now();
          if (now >= next_look) {
            next_look = now + std::chrono::seconds(1);
            const std::string f = self.failures();
            if (!f.empty()) {
              poisoned = true;
              throw Error("rank " + std::to_string(launch.rank) + ": stopped during " + what + " because " + f);
            }
          }
          if (now - start > limit + std::chrono::seconds(5)) {
            poisoned = true;
            throw Error("rank " + std::to_string(launch.rank) + ": " + what + " waited more than " +
                        std::to_string(limit.count() / 1000) + " s (distributed.timeout_seconds): a rank is hung or gone");
          }
        }
        if (!work->isSuccess()) std::rethrow_exception(work->exception());
      } else {
        work->wait(limit);
      }
    } catch (const Error&) {
      throw;
    } catch (...) {
      const std::string why = first_line(what_of(std::current_exception()));
      poisoned = true;
      const std::string f = self.failures();
      throw Error("rank " + std::to_string(launch.rank) + ": " + what + " failed" +
                  (f.empty() ? " (" + why + "); a rank probably died (killed, out of memory): its own output says why"
                             : " because " + f + " (" + why + ")"));
    }
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::connect(const LaunchInfo& launch, const ProcessGroupOptions& options) {
  // A peer that dies closes its sockets; Gloo's next write to one raises SIGPIPE, whose default
  // action would end this rank at once (exit 141) instead of the collective's error naming the
  // failure. Python ignores SIGPIPE when it starts, so PyTorch's ranks never see it; whittle ignores
  // it here, leaving a handler someone else installed alone.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
  auto impl = std::make_unique<Impl>();
  impl->launch = launch;
  impl->device = options.device;
  impl->timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000.0));
  std::string backend = options.backend;
  if (backend == "auto") backend = options.device.is_cuda() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl")
    throw Error("distributed backend '" + options.backend + "': expected auto, gloo or nccl", ErrorKind::kUsage);
  if (backend == "nccl" && !options.device.is_cuda())
    throw Error("distributed backend nccl runs on CUDA devices; this run is on " + options.device.str() + " (use gloo)",
                ErrorKind::kUsage);
  if (backend == "gloo" && options.device.is_cuda())
    throw Error("distributed backend gloo: whittle runs it on CPU; the run is on " + options.device.str() + " (use nccl)",
                ErrorKind::kUsage);
#if !(defined(WHITTLE_WITH_CUDA) && defined(WHITTLE_WITH_NCCL))
  if (backend == "nccl")
    throw Error("distributed backend nccl: this whittle was built without CUDA and NCCL (docs/distributed.md)", ErrorKind::kUsage);
#endif
  impl->backend = backend;
  impl->acknowledged.assign(static_cast<size_t>(launch.world_size), false);
  const std::string where = launch.master_addr + ":" + std::to_string(launch.port);
  const int rank = static_cast<int>(launch.rank);
  const int size = static_cast<int>(launch.world_size);

  c10::intrusive_ptr<c10d::Store> base;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(launch.port);
    so.isServer = !launch.agent_store && launch.rank == 0;
    so.numWorkers = static_cast<size_t>(launch.world_size);
    so.waitWorkers = !launch.agent_store;
    so.timeout = impl->timeout;
    so.multiTenant = true;
    base = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, so);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(launch.rank) + ": cannot " +
                (!launch.agent_store && launch.rank == 0 ? "host" : "reach") + " the rendezvous store at " + where +
                " (MASTER_ADDR:MASTER_PORT) within " + seconds_text(options.timeout_seconds) + " s: " +
                first_line(e.what()));
  }
  // A restarted torchrun job reuses its agent's store: each attempt its own keys.
  auto store = c10::make_intrusive<c10d::PrefixStore>("whittle/attempt_" + std::to_string(launch.restart_count), base);
  impl->store = c10::make_intrusive<c10d::PrefixStore>("status", store);
  try {
    auto group_store = c10::make_intrusive<c10d::PrefixStore>("default_pg", store);
    impl->pg = c10::make_intrusive<c10d::ProcessGroup>(group_store, rank, size);
    if (backend == "gloo") {
      auto o = c10d::ProcessGroupGloo::Options::create(impl->timeout);
      const bool lazy = c10d::getDefaultGlooLazyInit();
      if (const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME"); ifnames && *ifnames) {
        std::string list(ifnames);
        size_t begin = 0;
        while (begin <= list.size()) {
          const size_t end = std::min(list.find(',', begin), list.size());
          if (end > begin) o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(begin, end - begin), lazy));
          begin = end + 1;
        }
      }
      if (o->devices.empty()) o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice(lazy));
      o->threads = static_cast<int>(o->devices.size()) * 2;
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("cpu/", group_store),
                                                              rank, size, o);
      impl->pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      impl->pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    } else {
#if defined(WHITTLE_WITH_CUDA) && defined(WHITTLE_WITH_NCCL)
      // NCCL binds a communicator to the current device: this rank's (cuda:LOCAL_RANK).
      if (options.device.has_index()) c10::cuda::set_device(options.device.index());
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = impl->timeout;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("cuda/", group_store),
                                                              rank, size, o);
      impl->pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
      impl->pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#endif
    }
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(launch.rank) + ": the " + backend + " rendezvous of " + std::to_string(size) +
                " ranks through " + where + " failed: " + first_line(e.what()));
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

int64_t ProcessGroup::rank() const { return impl_->launch.rank; }
int64_t ProcessGroup::world_size() const { return impl_->launch.world_size; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
const at::Device& ProcessGroup::device() const { return impl_->device; }
bool ProcessGroup::broken() const { return impl_->poisoned; }

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = impl_->timeout;
    impl_->wait(impl_->pg->allreduce(one, o), "an all-reduce", *this);
  }
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int64_t root) {
  at::NoGradGuard no_grad;
  // One flat message per dtype.
  std::map<at::ScalarType, std::vector<at::Tensor*>> by_dtype;
  for (auto& t : tensors)
    if (t.defined() && t.numel() > 0) by_dtype[t.scalar_type()].push_back(&t);
  for (auto& [dtype, list] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (at::Tensor* t : list) flat_parts.push_back(t->detach().reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_parts)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = impl_->timeout;
    impl_->wait(impl_->pg->broadcast(flat, o), "a broadcast", *this);
    if (rank() == root) continue;
    int64_t offset = 0;
    for (at::Tensor* t : list) {
      const int64_t n = t->numel();
      t->detach().copy_(flat[0].slice(0, offset, offset + n).view(t->sizes()));
      offset += n;
    }
  }
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& value) {
  std::vector<at::Tensor> in{value.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int64_t r = 0; r < world_size(); ++r) out[0].push_back(at::empty_like(in[0]));
  c10d::AllgatherOptions o;
  o.timeout = impl_->timeout;
  impl_->wait(impl_->pg->allgather(out, in, o), "an all-gather", *this);
  return out[0];
}

bool ProcessGroup::any(bool flag) { return sum({flag ? 1.0 : 0.0})[0] > 0; }

void ProcessGroup::barrier(double timeout_seconds) {
  std::vector<at::Tensor> t{at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(impl_->device))};
  c10d::AllreduceOptions o;
  o.timeout = timeout_seconds > 0 ? std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0)) : impl_->timeout;
  impl_->wait(impl_->pg->allreduce(t, o), "a barrier", *this, o.timeout);
}

std::vector<double> ProcessGroup::sum(const std::vector<double>& values) {
  std::vector<at::Tensor> t{at::tensor(values, at::kDouble).to(impl_->device)};
  all_reduce_sum(t);
  const at::Tensor cpu = t[0].to(at::kCPU).contiguous();
  return std::vector<double>(cpu.data_ptr<double>(), cpu.data_ptr<double>() + cpu.numel());
}

void ProcessGroup::mark_failed_together() noexcept { impl_->poisoned = true; }

void ProcessGroup::report_failure(const std::string& message) noexcept {
  try {
    impl_->store->set("failure/" + std::to_string(rank()), bytes_of(message));
    impl_->store->add("failures", 1);
    // The store may be hosted by this process (rank 0 without torchrun): give the others time to
    // reach a collective and read the message; elsewhere a moment.
    const bool hosting = rank() == 0 && !impl_->launch.agent_store;
    const auto deadline = Clock::now() + std::chrono::seconds(hosting ? 30 : 10);
    const std::string acks = "acks/" + std::to_string(rank());
    while (Clock::now() < deadline && impl_->store->add(acks, 0) < world_size() - 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (const std::exception&) {
  }
  impl_->poisoned = true;
}

std::string ProcessGroup::failures() noexcept {
  std::string out;
  try {
    // One request while nothing failed (every waiting rank asks each second).
    if (impl_->store->add("failures", 0) == 0) return out;
    for (int64_t r = 0; r < world_size(); ++r) {
      if (r == rank()) continue;
      const std::string key = "failure/" + std::to_string(r);
      if (!impl_->store->check({key})) continue;
      const std::vector<uint8_t> v = impl_->store->get(key);
      out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " failed: " + std::string(v.begin(), v.end());
      if (!impl_->acknowledged[static_cast<size_t>(r)]) {
        impl_->acknowledged[static_cast<size_t>(r)] = true;
        impl_->store->add("acks/" + std::to_string(r), 1);
      }
    }
  } catch (const std::exception&) {
  }
  return out;
}

ReplicaSum replica_sum(const std::shared_ptr<ProcessGroup>& group) {
  std::weak_ptr<ProcessGroup> weak = group;
  return [weak](at::Tensor& values) {
    const std::shared_ptr<ProcessGroup> g = weak.lock();
    if (!g) throw Error("a sum over the ranks after the process group is gone");
    at::Tensor on_device = values.to(g->device());
    std::vector<at::Tensor> one{on_device};
    g->all_reduce_sum(one);
    if (!on_device.is_same(values)) values.copy_(on_device);
  };
}

// ---------------------------------------------------------------- DistributedDataParallel

struct DistributedDataParallel::State {
  std::vector<at::Tensor> parameters;  // those requiring gradients, in the caller's order
  std::vector<at::Tensor> buffers;
  std::unique_ptr<c10d::Reducer> reducer;
  bool sync = true;
};

namespace {

// A 64-bit FNV-1a hash of a tensor's bytes (CPU copy, contiguous).
int64_t hash_bytes(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<ProcessGroup> group, std::vector<at::Tensor> parameters,
                                                 std::vector<at::Tensor> buffers, DataParallelOptions options)
    : group_(std::move(group)), options_(options), state_(std::make_unique<State>()) {
  if (!group_) throw Error("DistributedDataParallel: no process group");
  // One model everywhere: rank 0's parameters (frozen ones too) and buffers.
  std::vector<at::Tensor> all;
  for (const auto* list : {&parameters, &buffers})
    for (const auto& t : *list)
      if (t.defined()) all.push_back(t);
  group_->broadcast(all, 0);
  set_parameters(std::move(parameters), std::move(buffers));
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<ProcessGroup> group, torch::nn::Module& module,
                                                 DataParallelOptions options)
    : DistributedDataParallel(std::move(group), module.parameters(), module.buffers(), options) {}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::set_parameters(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers) {
  std::vector<at::Tensor> trained;
  for (auto& p : parameters)
    if (p.defined() && p.requires_grad()) trained.push_back(p);
  state_->reducer.reset();  // its autograd hooks go with it
  state_->parameters = trained;
  state_->buffers.clear();
  for (auto& b : buffers)
    if (b.defined()) state_->buffers.push_back(b);
  if (trained.empty()) return;
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * 1024.0 * 1024.0);
  const int64_t first_cap = std::min<int64_t>(cap, 1024 * 1024);
  const std::vector<bool> sparse(trained.size(), false);
  // As DDP: the first iteration reduces in one bucket when every parameter gets a gradient
  // (their order of readiness is not known yet); then the reducer rebuilds its buckets in the order
  // the gradients came (rebuild_buckets, before the next forward), with the first one small.
  const std::vector<size_t> limits = options_.find_unused_parameters
                                         ? std::vector<size_t>{static_cast<size_t>(first_cap), static_cast<size_t>(cap)}
                                         : std::vector<size_t>{std::numeric_limits<size_t>::max()};
  auto [indices, per_bucket] = c10d::compute_bucket_assignment_by_size(trained, limits, sparse);
  std::reverse(indices.begin(), indices.end());
  std::unordered_map<size_t, std::string> names;
  try {
    state_->reducer = std::make_unique<c10d::Reducer>(trained, indices, group_->impl().pg, sparse, cap,
                                                      options_.find_unused_parameters, /*gradient_as_bucket_view=*/false,
                                                      names, first_cap, /*skip_all_reduce_unused_params=*/false,
                                                      /*use_python_reducer=*/false, std::vector<int64_t>{});
  } catch (const c10::Error& e) {
    throw Error("DistributedDataParallel: " + first_line(e.what_without_backtrace()));
  }
}

void DistributedDataParallel::broadcast_buffers() {
  if (!state_->buffers.empty()) group_->broadcast(state_->buffers, 0);
}

void DistributedDataParallel::before_forward(bool sync_gradients, bool with_buffers) {
  state_->sync = sync_gradients;
  sync_bn_.reset();
  if (options_.sync_batchnorm) sync_bn_ = std::make_unique<CrossReplicaBatchNorm>(replica_sum(group_));
  if (state_->reducer && sync_gradients) {
    try {
      state_->reducer->prepare_for_forward();
    } catch (const c10::Error& e) {
      throw Error("rank " + std::to_string(group_->rank()) + ": " + first_line(e.what_without_backtrace()) +
                  (options_.find_unused_parameters ? "" : " (distributed.find_unused_parameters: true allows parameters without a gradient)"));
    }
    try {
      state_->reducer->rebuild_buckets();  // once, after the first backward: a broadcast of rank 0's buckets
    } catch (const c10::DistBackendError&) {
      collective_failed(std::current_exception());
    } catch (const c10::Error& e) {
      // "Expected to have finished reduction in the prior iteration": a parameter got no gradient.
      throw Error("rank " + std::to_string(group_->rank()) + ": " + first_line(e.what_without_backtrace()) +
                  (options_.find_unused_parameters ? "" : " (distributed.find_unused_parameters: true allows parameters without a gradient)"));
    } catch (const std::exception& e) {
      group_->impl().poisoned = true;
      const std::string f = group_->failures();
      throw Error("rank " + std::to_string(group_->rank()) + ": rebuilding the gradient buckets failed" +
                  (f.empty() ? " (" + first_line(e.what()) + "); a rank probably died" : " because " + f));
    }
  }
  if (options_.broadcast_buffers && with_buffers) broadcast_buffers();
}

void DistributedDataParallel::backward(const at::Tensor& loss) {
  sync_bn_.reset();  // the forward is done; its batch norms keep the sum for their backward
  if (state_->reducer && state_->sync) {
    try {
      state_->reducer->prepare_for_backward(options_.find_unused_parameters ? std::vector<at::Tensor>{loss}
                                                                            : std::vector<at::Tensor>{});
    } catch (const c10::Error& e) {
      throw Error("rank " + std::to_string(group_->rank()) + ": " + first_line(e.what_without_backtrace()));
    }
  }
  try {
    loss.backward();
  } catch (const c10::DistBackendError&) {
    collective_failed(std::current_exception());
  } catch (const c10::Error&) {
    throw;  // this rank's own error in the backward pass (cmd_run reports it to the others)
  } catch (const Error&) {
    throw;  // whittle's own (a synchronized batch norm's all-reduce names itself)
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception&) {
    collective_failed(std::current_exception());  // Gloo's transport errors
  }
  state_->sync = true;
}

void DistributedDataParallel::collective_failed(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    group_->impl().poisoned = true;
    const std::string f = group_->failures();
    throw Error("rank " + std::to_string(group_->rank()) + ": the backward pass's gradient all-reduce failed" +
                (f.empty() ? " (" + first_line(e.what()) + "); a rank probably died (killed, out of memory): its own output says why"
                           : " because " + f));
  }
}

void DistributedDataParallel::verify_parameters_equal(const std::string& when) {
  const auto n = static_cast<int64_t>(state_->parameters.size());
  // The counts first: an all-gather of unequal shapes would fail without saying why.
  const std::vector<at::Tensor> counts = group_->all_gather(at::full({1}, n, at::kLong).to(group_->device()));
  for (size_t r = 0; r < counts.size(); ++r)
    if (counts[r].item<int64_t>() != n)
      throw Error(when + ": rank " + std::to_string(r) + " trains " + std::to_string(counts[r].item<int64_t>()) +
                  " parameters, rank " + std::to_string(group_->rank()) + " " + std::to_string(n) +
                  ": the ranks no longer train one model");
  at::Tensor mine = at::empty({n + 1}, at::kLong);
  auto* h = mine.data_ptr<int64_t>();
  h[0] = n;
  for (int64_t i = 0; i < n; ++i) h[i + 1] = hash_bytes(state_->parameters[static_cast<size_t>(i)]);
  const std::vector<at::Tensor> all = group_->all_gather(mine.to(group_->device()));
  for (size_t r = 0; r < all.size(); ++r) {
    const at::Tensor other = all[r].to(at::kCPU);
    const auto* o = other.data_ptr<int64_t>();
    if (o[0] != n)
      throw Error(when + ": rank " + std::to_string(r) + " trains " + std::to_string(o[0]) + " parameters, rank " +
                  std::to_string(group_->rank()) + " " + std::to_string(n));
    for (int64_t i = 0; i < n; ++i)
      if (o[i + 1] != h[i + 1]) {
        std::string shape;
        for (int64_t d : state_->parameters[static_cast<size_t>(i)].sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        throw Error(when + ": parameter " + std::to_string(i) + " of " + std::to_string(n) + " (shape [" + shape +
                    "]) differs between rank " + std::to_string(r) + " and rank " + std::to_string(group_->rank()) +
                    ": the ranks no longer train one model");
      }
  }
}

}  // namespace whittle::runner
