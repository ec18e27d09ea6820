// Data-parallel training (runner/distributed.h): the launch variables, the distributed sampler,
// and `whittle run` with 2 local ranks on Gloo, started by hand and through torchrun: the result
// equals one process accumulating the gradients of the same two half-batches, the ranks stay
// bitwise equal, only rank 0 writes, Ctrl-C and --resume work, and a rank that fails or dies
// ends the other with exit code 1 and a message naming it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/load.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "graph/functional.h"
#include "graph/graph_module.h"
#include "recipe_support.h"
#include "runner/distributed.h"
#include "runner/model_loader.h"
#include "runner/optimizer.h"
#include "runner/trainer.h"
#include "support.h"
#include "thread_sum.h"

namespace whittle::test {
namespace {

using namespace whittle::runner;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- launch variables

// Sets the launch variables for the scope, restoring what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const char* k : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}) {
      if (const char* v = std::getenv(k)) saved_[k] = v;
      ::unsetenv(k);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* k : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"})
      ::unsetenv(k);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string launch_error(const std::map<std::string, std::string>& vars) {
  ScopedEnv env(vars);
  try {
    launch_from_environment();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST(LaunchFromEnvironment, ReadsTheVariablesTorchrunSets) {
  {
    ScopedEnv env({});
    EXPECT_FALSE(launch_from_environment().has_value());
  }
  {
    ScopedEnv env({{"WORLD_SIZE", "1"}, {"RANK", "0"}});  // torchrun --nproc-per-node=1: one process
    EXPECT_FALSE(launch_from_environment().has_value());
  }
  ScopedEnv env({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
                 {"MASTER_PORT", "29400"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const std::optional<LaunchInfo> l = launch_from_environment();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->world_size, 4);
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->master_addr, "node7");
  EXPECT_EQ(l->port, 29400);
  EXPECT_TRUE(l->agent_store);
}

TEST(LaunchFromEnvironment, NamesTheBadVariable) {
  const std::map<std::string, std::string> ok{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const char* v) {
    auto m = ok;
    if (v) m[k] = v;
    else m.erase(k);
    return m;
  };
  EXPECT_NE(launch_error(with("RANK", nullptr)).find("RANK is not"), std::string::npos);
  EXPECT_NE(launch_error(with("RANK", "2")).find("RANK=2 is outside [0, WORLD_SIZE=2)"), std::string::npos);
  EXPECT_NE(launch_error(with("RANK", "one")).find("RANK='one' is not a whole number"), std::string::npos);
  EXPECT_NE(launch_error(with("WORLD_SIZE", "2x")).find("WORLD_SIZE='2x'"), std::string::npos);
  EXPECT_NE(launch_error(with("MASTER_ADDR", nullptr)).find("MASTER_ADDR is not"), std::string::npos);
  EXPECT_NE(launch_error(with("MASTER_PORT", nullptr)).find("MASTER_PORT is not"), std::string::npos);
  EXPECT_NE(launch_error(with("MASTER_PORT", "70000")).find("MASTER_PORT=70000 is outside 1..65535"), std::string::npos);
  EXPECT_NE(launch_error(with("LOCAL_RANK", "-1")).find("LOCAL_RANK=-1"), std::string::npos);
  EXPECT_EQ(launch_error(ok), "");
}

// ---------------------------------------------------------------- the distributed sampler

data::Dataset numbered(int64_t n) {
  data::Dataset d;
  d.images = at::zeros({n, 1, 2, 2}, at::kByte);
  d.labels = at::arange(n, at::kLong).remainder(3);
  return d;
}

std::vector<int64_t> indices_of_epoch(data::DataLoader& loader, int64_t epoch) {
  std::vector<int64_t> out;
  loader.set_epoch(epoch);
  for (auto& b : loader)
    for (int64_t i = 0; i < b.indices.size(0); ++i) out.push_back(b.indices[i].item<int64_t>());
  return out;
}

TEST(DistributedSampler, RanksShareOutEachEpochAndTheShardsChange) {
  const auto ds = std::make_shared<const data::Dataset>(numbered(10));
  data::LoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 0;
  o.seed = 7;
  data::DataLoader whole(ds, o);
  std::vector<std::vector<int64_t>> shards[2];
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> order = whole.permutation(epoch);
    for (int64_t r = 0; r < 3; ++r) {
      o.num_replicas = 3;
      o.rank = r;
      data::DataLoader mine(ds, o);
      // 10 over 3 ranks: 4 each, the order's first two repeated to fill the last round.
      EXPECT_EQ(mine.shard_size(), 4);
      EXPECT_EQ(mine.num_batches(), 2);
      const std::vector<int64_t> got = indices_of_epoch(mine, epoch);
      const std::vector<int64_t> want{order[static_cast<size_t>(r)], order[static_cast<size_t>(r + 3)],
                                      order[static_cast<size_t>(r + 6)], order[static_cast<size_t>((r + 9) % 10)]};
      EXPECT_EQ(got, want) << "rank " << r << " epoch " << epoch;
      shards[epoch].push_back(got);
    }
    std::set<int64_t> all;
    for (const auto& s : shards[epoch]) all.insert(s.begin(), s.end());
    EXPECT_EQ(all.size(), 10u) << "the union over the ranks is the whole epoch";
  }
  EXPECT_NE(shards[0][0], shards[1][0]) << "shards change every epoch";

  // Evaluation: the exact stride, each image once (shards of 4, 3, 3).
  o.shuffle = false;
  o.even_shards = false;
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < 3; ++r) {
    o.rank = r;
    data::DataLoader mine(ds, o);
    EXPECT_EQ(mine.shard_size(), r == 0 ? 4 : 3);
    for (int64_t i : indices_of_epoch(mine, 0)) seen.push_back(i);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), int64_t{0});
  EXPECT_EQ(seen, all);

  o.rank = 3;
  EXPECT_THROW(data::DataLoader(ds, o), Error);
}

// ---------------------------------------------------------------- synchronized batch norm

TEST(CrossReplicaBatchNorm, TwoReplicasComputeTheBatchNormOfTheirUnion) {
  // A batch [8, 3, 4, 4] split in two halves, each on its own thread in a CrossReplicaBatchNorm
  // scope: outputs, input gradients, running statistics equal at::batch_norm of the whole batch;
  // the weight and bias gradients of the halves add up to the whole batch's.
  at::manual_seed(3);
  const at::Tensor x = at::randn({8, 3, 4, 4}, at::kDouble) * 2 + 1;
  const at::Tensor w0 = at::randn({3}, at::kDouble), b0 = at::randn({3}, at::kDouble);
  const at::Tensor dy = at::randn({8, 3, 4, 4}, at::kDouble);
  at::Tensor xw = x.clone().requires_grad_(true), ww = w0.clone().requires_grad_(true), bw = b0.clone().requires_grad_(true);
  at::Tensor rm = at::zeros({3}, at::kDouble), rv = at::ones({3}, at::kDouble);
  at::Tensor yw = batch_norm_forward(xw, ww, bw, rm, rv, nullptr, true, 0.1, 1e-5);
  (yw * dy).sum().backward();

  auto sum = std::make_shared<ThreadSum>(2);
  std::vector<at::Tensor> y(2), dx(2), dw(2), db(2), rms(2), rvs(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      at::Tensor xr = x.slice(0, 4 * r, 4 * r + 4).clone().requires_grad_(true);
      at::Tensor wr = w0.clone().requires_grad_(true), br = b0.clone().requires_grad_(true);
      rms[r] = at::zeros({3}, at::kDouble);
      rvs[r] = at::ones({3}, at::kDouble);
      {
        CrossReplicaBatchNorm scope([sum](at::Tensor& v) { (*sum)(v); });
        y[r] = batch_norm_forward(xr, wr, br, rms[r], rvs[r], nullptr, true, 0.1, 1e-5);
      }
      (y[r] * dy.slice(0, 4 * r, 4 * r + 4)).sum().backward();
      dx[r] = xr.grad();
      dw[r] = wr.grad();
      db[r] = br.grad();
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(all_close(at::cat({y[0], y[1]}), yw, 1e-12, 1e-10));
  EXPECT_TRUE(all_close(at::cat({dx[0], dx[1]}), xw.grad(), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(dw[0] + dw[1], ww.grad(), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(db[0] + db[1], bw.grad(), 1e-12, 1e-10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(all_close(rms[r], rm, 1e-12, 1e-10));
    EXPECT_TRUE(all_close(rvs[r], rv, 1e-12, 1e-10));
  }
  // Outside a scope a half is normalized alone.
  at::Tensor alone = batch_norm_forward(x.slice(0, 0, 4), w0, b0, at::zeros({3}, at::kDouble),
                                        at::ones({3}, at::kDouble), nullptr, true, 0.1, 1e-5);
  EXPECT_FALSE(all_close(alone, yw.slice(0, 0, 4), 1e-3, 0));
}

// ---------------------------------------------------------------- whole runs

// Binds a TCP socket to 127.0.0.1:`port` (0: the kernel picks) and returns the port it got, or 0.
int bind_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// A TCP port on 127.0.0.1 that nothing listens on, for a rendezvous. Drawn at random outside the
// kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), below
// or above it, whichever side is wider: the kernel gives ports in that range to outgoing
// connections, so one freed there could be taken again before the ranks bind it; outside it only an
// explicit bind takes a port. Checked by binding it; without room outside the range, the kernel's
// pick.
int free_port() {
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> low >> high)) low = 32768, high = 60999;
  const bool below = low - 1024 >= 65535 - high;
  const int first = below ? 1024 : high + 1, last = below ? low - 1 : 65535;
  if (last - first >= 1000) {
    static std::mt19937 draw(std::random_device{}());
    std::uniform_int_distribution<int> pick(first, last);
    for (int attempt = 0; attempt < 100; ++attempt)
      if (const int port = bind_loopback(pick(draw))) return port;
  }
  if (const int port = bind_loopback(0)) return port;
  throw std::runtime_error("free_port: no port to bind on 127.0.0.1");
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A child process running `argv` with `env` added, its stdout and stderr into `log`.
struct Child {
  pid_t pid = -1;
  std::string log;
};

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, const std::string& log) {
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    FILE* f = std::fopen(log.c_str(), "w");
    if (!f) std::_Exit(126);
    ::dup2(fileno(f), 1);
    ::dup2(fileno(f), 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::_Exit(127);
  }
  return c;
}

// The exit code (128 + signal when killed), or -1 when it ran past `seconds` (then it is killed).
int wait_for(const Child& c, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, nullptr, 0);
  return -1;
}

std::string whittle_bin() { return join_path(binary_dir(), "whittle"); }
std::string mnist() { return join_path(source_dir(), "data/mnist10k"); }

// LeNet-5 on the 8,000 training digits in batches of 200 a rank (20 steps an epoch with 2
// ranks), constant learning rate, SGD with Nesterov momentum and weight decay, one thread a rank.
std::string write_recipe(const std::string& dir, int epochs, const std::string& extra = "", int batch = 200,
                         const std::string& name = "recipe.yaml", const std::string& data_extra = "") {
  make_directories(dir);
  const std::string path = join_path(dir, name);
  std::ofstream f(path);
  f << "model: {name: lenet5}\n"
    << "data: {train: " << mnist() << ", test: " << mnist() << ", test_split: t10k, mean: [0.1307], std: [0.3081], "
    << "batch_size: " << batch << ", test_limit: 500, num_workers: 0" << data_extra << "}\n"
    << "training: {epochs: " << epochs << ", optimizer: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, "
    << "weight_decay: 0.0005}, threads: 1, log_every: 2}\n"
    << "distributed: {timeout_seconds: 30, verify_every: 1" << extra << "}\n";
  return path;
}

std::map<std::string, std::string> rank_env(int rank, int port) {
  return {{"WORLD_SIZE", "2"}, {"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)},
          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"OMP_NUM_THREADS", "1"}};
}

// Starts both ranks of `whittle run RECIPE --out <dir>/run` by hand (rank 1 with `rank1_out` when
// given), with `extra` arguments per rank.
std::array<Child, 2> start_ranks(const std::string& recipe, const std::string& dir, const std::string& rank1_out = "",
                                 const std::array<std::vector<std::string>, 2>& extra = {}) {
  const int port = free_port();
  std::array<Child, 2> c;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv{whittle_bin(), "run", recipe, "--out",
                                  r == 1 && !rank1_out.empty() ? rank1_out : join_path(dir, "run")};
    argv.insert(argv.end(), extra[static_cast<size_t>(r)].begin(), extra[static_cast<size_t>(r)].end());
    c[static_cast<size_t>(r)] = spawn(argv, rank_env(r, port), join_path(dir, "rank" + std::to_string(r) + ".log"));
  }
  return c;
}

std::map<std::string, at::Tensor> checkpoint_parameters(const std::string& path, bool with_buffers = false) {
  GraphModule m(load_checkpoint(path).graph);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  if (with_buffers)
    for (const auto& b : m->named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

// One process, the same run: every step the gradients of rank 0's and rank 1's batch of that step
// accumulated (each loss halved), then the optimizer step.
std::map<std::string, at::Tensor> accumulated_reference(const std::string& recipe_path, int64_t steps) {
  const Recipe r = load_recipe(recipe_path);
  at::set_num_threads(1);
  ModelSource src;
  src.name = "lenet5";
  src.seed = 0;
  src.input_shape = {1, 1, 28, 28};
  GraphModule model(load_model(src));
  model->train();
  std::ostringstream quiet;
  auto train = std::make_shared<const data::Dataset>(load_split(mnist(), "train", "", quiet));
  std::vector<std::unique_ptr<data::DataLoader>> loaders;
  for (int64_t rank = 0; rank < 2; ++rank) {
    data::LoaderOptions o;
    o.batch_size = r.data.batch_size;
    o.drop_last = true;
    o.num_workers = 0;
    o.seed = 0;
    o.transform.mean = r.data.mean;
    o.transform.stddev = r.data.std;
    o.num_replicas = 2;
    o.rank = rank;
    loaders.push_back(std::make_unique<data::DataLoader>(train, o));
  }
  auto opt = make_optimizer(r.training.optimizer, trainable_parameters(model));
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t per_epoch = loaders[0]->num_batches();
    for (auto& loader : loaders) {
      const data::Batch b = loader->batch(k / per_epoch, k % per_epoch);
      at::Tensor loss = at::cross_entropy_loss(model->forward(b.images), b.labels) / 2.0;
      loss.backward();
    }
    opt->step();
    opt->zero_grad(true);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(ProcessGroupSignals, JoiningIgnoresSigpipeUnlessAHandlerIsSet) {
  // A SIGKILLed peer's sockets are closed; a Gloo write to one raises SIGPIPE, which by default ends
  // the rank (exit 141) before it can name the failure. Joining sets SIGPIPE to ignored, and leaves
  // a handler installed before it alone.
  struct sigaction saved {}, now {}, mine {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &saved), 0);
  LaunchInfo launch;
  launch.port = free_port();
  ProcessGroupOptions options;
  options.timeout_seconds = 30;

  signal(SIGPIPE, SIG_DFL);
  { auto group = ProcessGroup::connect(launch, options); }
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);

  static void (*const handler)(int) = [](int) {};
  mine.sa_handler = handler;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &mine, nullptr), 0);
  launch.port = free_port();
  { auto group = ProcessGroup::connect(launch, options); }
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, handler);
  sigaction(SIGPIPE, &saved, nullptr);
}

TEST(DataParallelRun, TwoRanksEqualOneProcessAccumulatingTheirHalfBatches) {
  const std::string dir = fresh_dir("distributed/accumulation");
  const std::string recipe = write_recipe(dir, 1);
  const std::string rank1_out = join_path(dir, "rank1_out");
  auto ranks = start_ranks(recipe, dir, rank1_out);
  EXPECT_EQ(wait_for(ranks[0], 120), 0) << read_text(ranks[0].log);
  EXPECT_EQ(wait_for(ranks[1], 30), 0) << read_text(ranks[1].log);
  const std::string log0 = read_text(ranks[0].log);
  EXPECT_NE(log0.find("data parallel: 2 ranks (gloo), each training 4000 images an epoch in batches of 200 and testing 250; "
                      "400 images a step"),
            std::string::npos)
      << log0;
  // verify_every 1: the ranks' parameters were bitwise equal after each of the 20 steps, or the
  // run would have failed. Only rank 0 writes: rank 1 creates not even its --out directory.
  EXPECT_FALSE(path_exists(rank1_out));
  EXPECT_EQ(read_text(ranks[1].log), "");
  const std::string report = read_text(join_path(dir, "run/report.json"));
  EXPECT_NE(report.find("\"world_size\": 2"), std::string::npos) << report;
  EXPECT_NE(report.find("\"global_batch_size\": 400"), std::string::npos) << report;

  const auto got = checkpoint_parameters(join_path(dir, "run/model.h5"));
  const auto want = accumulated_reference(recipe, 20);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(all_close(got.at(name), w, 1e-5, 0)) << name;
    worst = std::max(worst, (got.at(name) - w).abs().max().item<double>());
  }
  std::cout << "2 ranks against one process accumulating: largest difference " << worst << "\n";
  // Measured: bitwise equal (largest difference 0) with AVX2 and with ATEN_CPU_CAPABILITY=default,
  // one thread a process as here; the 1e-5 bound leaves room for another summation order.
  // The comparison means something: 20 steps moved the weights far more than the tolerance.
  ModelSource src;
  src.name = "lenet5";
  src.seed = 0;
  src.input_shape = {1, 1, 28, 28};
  GraphModule init(load_model(src));
  double change = 0;
  for (const auto& p : init->named_parameters())
    change = std::max(change, (p.value() - want.at(p.key())).abs().max().item<double>());
  EXPECT_GT(change, 1e-2);

  // The same run through torchrun (its agent hosts the store): the same bits.
  const std::string torchrun = join_path(parent_directory(test::python_path()), "torchrun");
  const std::string tdir = join_path(dir, "torchrun");
  make_directories(tdir);
  const Child t = spawn({torchrun, "--no-python", "--nproc-per-node=2", "--master-port=" + std::to_string(free_port()),
                         whittle_bin(), "run", recipe, "--out", join_path(tdir, "run")},
                        {{"OMP_NUM_THREADS", "1"}}, join_path(tdir, "torchrun.log"));
  ASSERT_EQ(wait_for(t, 180), 0) << read_text(t.log);
  const auto via_torchrun = checkpoint_parameters(join_path(tdir, "run/model.h5"));
  for (const auto& [name, g] : got) EXPECT_TRUE(at::equal(via_torchrun.at(name), g)) << name;
}

TEST(DataParallelRun, SyncBatchNormTrainsAsOneProcessOnTheGlobalBatch) {
  // 2 ranks × 100 images with synchronized batch norm against one process with a batch of 200: the
  // same images (rank r's batch is positions r, r + 2, ... of the single batch), the same batch
  // statistics, so after one step the same parameters and running statistics, up to float rounding
  // (measured 9.4e-6 at most, with AVX2 and with ATEN_CPU_CAPABILITY=default; the bound is 3e-5).
  // Without the synchronization LeNet-5's batch norms see 100 images: measured 8.0e-3. One step only: the two sides run different
  // batch-norm code (ATen's against CrossReplicaBatchNorm's sums), and training multiplies a
  // rounding difference about 20-fold a step; the math itself is checked to 1e-10 above.
  const std::string dir = fresh_dir("distributed/sync_bn");
  const std::string one_step = ", train_limit: 200";
  const std::string single_recipe = write_recipe(dir, 1, "", 200, "single.yaml", one_step);
  const Child single = spawn({whittle_bin(), "run", single_recipe, "--out", join_path(dir, "single")},
                             {{"OMP_NUM_THREADS", "1"}}, join_path(dir, "single.log"));
  ASSERT_EQ(wait_for(single, 120), 0) << read_text(single.log);
  const auto want = checkpoint_parameters(join_path(dir, "single/model.h5"), true);
  for (const bool sync : {true, false}) {
    const std::string sub = join_path(dir, sync ? "synced" : "local");
    const std::string recipe = write_recipe(sub, 1, sync ? ", sync_batchnorm: true" : "", 100, "recipe.yaml", one_step);
    auto ranks = start_ranks(recipe, sub);
    ASSERT_EQ(wait_for(ranks[0], 120), 0) << read_text(ranks[0].log);
    ASSERT_EQ(wait_for(ranks[1], 30), 0) << read_text(ranks[1].log);
    const auto got = checkpoint_parameters(join_path(sub, "run/model.h5"), true);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (const auto& [name, w] : want) {
      if (w.scalar_type() != at::kFloat) continue;  // num_batches_tracked
      worst = std::max(worst, (got.at(name) - w).abs().max().item<double>());
      if (sync) {
        EXPECT_TRUE(all_close(got.at(name), w, 3e-5, 0)) << name;
      }
    }
    std::cout << (sync ? "synchronized" : "local") << " batch norm: largest difference " << worst << "\n";
    if (!sync) {
      EXPECT_GT(worst, 1e-3) << "local batch statistics should give another model";
    }
  }
}

TEST(DataParallelRun, TaylorPruningRemovesTheSameChannelsOnEveryRank) {
  // Taylor scores sum |w·g| over the batches a rank saw, before the gradients are averaged: summed
  // over the ranks before the plan, every rank removes the same channels (verify_every: 1 would
  // stop the run at the first step after a different choice).
  const std::string dir = fresh_dir("distributed/taylor");
  const std::string recipe = write_recipe(dir, 1);
  {
    std::ofstream f(recipe, std::ios::app);
    f << "modifiers:\n  - {name: prune, criterion: taylor, sparsity: 0.5, start_epoch: 0.5, schedule: one_shot}\n";
  }
  auto ranks = start_ranks(recipe, dir);
  EXPECT_EQ(wait_for(ranks[0], 120), 0) << read_text(ranks[0].log);
  EXPECT_EQ(wait_for(ranks[1], 30), 0) << read_text(ranks[1].log);
  const std::string log0 = read_text(ranks[0].log);
  EXPECT_NE(log0.find("prune step 1/1"), std::string::npos) << log0;
  EXPECT_EQ(read_text(ranks[1].log), "") << "modifiers print on rank 0 only";
  const auto pruned = checkpoint_parameters(join_path(dir, "run/model.h5"));
  EXPECT_EQ(pruned.at("conv1.weight").size(0), 3) << "half of conv1's 6 channels removed";
}

TEST(DataParallelRun, Int8ObserversTrainOnTheSameGridOnEveryRank) {
  // int8 QAT with observers: after each step the observers' mean over the ranks sets every rank's
  // grid (quantize::sync_replicas; its arithmetic is held in int8_test). Here the collectives of
  // both ranks line up through a whole run (a rank calling one collective more or fewer would hang
  // until the timeout), and the checkpoint keeps the observers.
  const std::string dir = fresh_dir("distributed/int8_observers");
  const std::string recipe = write_recipe(dir, 1);
  {
    std::ofstream f(recipe, std::ios::app);
    f << "modifiers:\n  - {name: quantize, method: int8, calibration_batches: 1, observe: true}\n";
  }
  auto ranks = start_ranks(recipe, dir);
  EXPECT_EQ(wait_for(ranks[0], 120), 0) << read_text(ranks[0].log);
  EXPECT_EQ(wait_for(ranks[1], 30), 0) << read_text(ranks[1].log);
  const auto saved = checkpoint_parameters(join_path(dir, "run/model.h5"), /*with_buffers=*/true);
  int64_t observers = 0;
  for (const auto& [name, t] : saved)
    if (name.size() > 13 && name.compare(name.size() - 13, 13, ".observed_max") == 0) ++observers;
  EXPECT_GT(observers, 0);
}

TEST(DataParallelRun, CtrlCStopsEveryRankAndResumeEndsAsTheUninterruptedRun) {
  // Batches of 50: 80 steps an epoch, so the Ctrl-C sent once epoch 2 shows lands inside it even
  // when this process is slow to see the line (with 20 steps the window was a few tenths of a second).
  const std::string dir = fresh_dir("distributed/resume");
  const std::string recipe = write_recipe(dir, 3, "", 50);
  make_directories(join_path(dir, "whole"));
  auto whole = start_ranks(recipe, join_path(dir, "whole"));
  ASSERT_EQ(wait_for(whole[0], 180), 0) << read_text(whole[0].log);
  ASSERT_EQ(wait_for(whole[1], 30), 0) << read_text(whole[1].log);

  const std::string part = join_path(dir, "part");
  make_directories(part);
  auto ranks = start_ranks(recipe, part);
  // Interrupt both, as a terminal's Ctrl-C does, once rank 0 is inside epoch 2.
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (read_text(ranks[0].log).find("epoch 2/3") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(ranks[0].pid, SIGINT);
  ::kill(ranks[1].pid, SIGINT);
  EXPECT_EQ(wait_for(ranks[0], 60), 130) << read_text(ranks[0].log);
  EXPECT_EQ(wait_for(ranks[1], 60), 130) << read_text(ranks[1].log);
  ASSERT_NE(read_text(ranks[0].log).find("interrupted: training state saved"), std::string::npos) << read_text(ranks[0].log);
  // Inside an epoch the position counts each rank's batches: one process may not take it over.
  const Child alone = spawn({whittle_bin(), "run", recipe, "--out", join_path(part, "run"), "--resume"}, {},
                            join_path(part, "alone.log"));
  EXPECT_EQ(wait_for(alone, 60), 2);
  EXPECT_NE(read_text(alone.log).find("stopped inside epoch 2 with 2 rank(s); this run has 1"), std::string::npos)
      << read_text(alone.log);
  auto resumed = start_ranks(recipe, part, "", {std::vector<std::string>{"--resume"}, std::vector<std::string>{"--resume"}});
  EXPECT_EQ(wait_for(resumed[0], 180), 0) << read_text(resumed[0].log);
  EXPECT_EQ(wait_for(resumed[1], 30), 0) << read_text(resumed[1].log);
  EXPECT_NE(read_text(resumed[0].log).find("resuming"), std::string::npos);
  const auto a = checkpoint_parameters(join_path(dir, "whole/run/model.h5"));
  const auto b = checkpoint_parameters(join_path(part, "run/model.h5"));
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(b.at(name), t)) << name;
  EXPECT_EQ(read_text(join_path(dir, "whole/run/metrics.jsonl")).substr(0, 60),
            read_text(join_path(part, "run/metrics.jsonl")).substr(0, 60));
  // Resuming the finished run on both ranks: both agree there is nothing to do; no file changes.
  const std::string report = read_text(join_path(dir, "whole/run/report.json"));
  auto again = start_ranks(recipe, join_path(dir, "whole"), "", {std::vector<std::string>{"--resume"}, std::vector<std::string>{"--resume"}});
  EXPECT_EQ(wait_for(again[0], 120), 0) << read_text(again[0].log);
  EXPECT_EQ(wait_for(again[1], 30), 0) << read_text(again[1].log);
  EXPECT_NE(read_text(again[0].log).find("nothing to resume"), std::string::npos) << read_text(again[0].log);
  EXPECT_EQ(read_text(join_path(dir, "whole/run/report.json")), report);
  for (const auto& [name, t] : checkpoint_parameters(join_path(dir, "whole/run/model.h5"))) EXPECT_TRUE(at::equal(a.at(name), t)) << name;
}

TEST(DataParallelRun, ARankThatFailsStopsTheOtherNamingIt) {
  // Rank 1 alone is told to resume a run that has no training state: it fails after joining, and
  // rank 0, waiting for it in the first broadcast, stops with rank 1's message.
  const std::string dir = fresh_dir("distributed/fail");
  const std::string recipe = write_recipe(dir, 1);
  auto ranks = start_ranks(recipe, dir, join_path(dir, "elsewhere"), {std::vector<std::string>{}, {"--resume"}});
  EXPECT_EQ(wait_for(ranks[1], 60), 1) << read_text(ranks[1].log);
  EXPECT_EQ(wait_for(ranks[0], 60), 1) << read_text(ranks[0].log);
  const std::string log0 = read_text(ranks[0].log), log1 = read_text(ranks[1].log);
  // Rank 0 learned of the failure from rank 1's message, not by waiting out its collective
  // timeout (which would name distributed.timeout_seconds).
  EXPECT_EQ(log0.find("distributed.timeout_seconds"), std::string::npos) << log0;
  EXPECT_NE(log1.find("rank 1: "), std::string::npos) << log1;
  EXPECT_NE(log1.find("train_state.pt"), std::string::npos) << log1;
  EXPECT_NE(log0.find("because rank 1 failed: "), std::string::npos) << log0;
  EXPECT_NE(log0.find("train_state.pt"), std::string::npos) << log0;
  EXPECT_FALSE(path_exists(join_path(dir, "run/model.h5")));
}

TEST(DataParallelRun, KillingOneRankEndsTheOtherWithinTheTimeout) {
  const std::string dir = fresh_dir("distributed/kill");
  const std::string recipe = write_recipe(dir, 20);
  auto ranks = start_ranks(recipe, dir);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (read_text(ranks[0].log).find("epoch 1/20  4/20") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The kill lands inside training: rank 0 printed its fourth step of epoch 1 and is still running.
  const std::string before = read_text(ranks[0].log);
  ::kill(ranks[1].pid, SIGKILL);
  EXPECT_NE(before.find("epoch 1/20  4/20"), std::string::npos) << before;
  EXPECT_EQ(wait_for(ranks[1], 10), 128 + SIGKILL);
  // Rank 0 ends with an error (exit 1, not a hang: wait_for kills it past 90 s and returns -1),
  // either at once from the closed connection or after its collective timeout (30 s here), and
  // says which.
  EXPECT_EQ(wait_for(ranks[0], 90), 1) << read_text(ranks[0].log);
  const std::string log0 = read_text(ranks[0].log);
  EXPECT_NE(log0.find("rank 0: "), std::string::npos) << log0;
  EXPECT_NE(log0.find("failed"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("interrupted"), std::string::npos) << log0;  // not a clean stop
  EXPECT_FALSE(path_exists(join_path(dir, "run/model.h5")));  // 20 epochs never finished
}

}  // namespace
}  // namespace whittle::test
