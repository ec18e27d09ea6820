// Checkpoints: exact round trip, atomic writes, and clean errors for truncated, corrupted,
// newer-format and unwritable files.

#include <hdf5.h>

#include <fstream>

#include "export/checkpoint.h"
#include "core/error.h"
#include "core/file_util.h"
#include "graph/graph_module.h"
#include "graph/version.h"
#include "support.h"
#include "test_models.h"

namespace whittle {
namespace {

using test::all_close;

class CheckpointTest : public test::SeededTest {
 protected:
  void SetUp() override {
    test::SeededTest::SetUp();
    dir_ = test::binary_dir() + "/testdata/checkpoint/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    remove_tree(dir_);
    make_directories(dir_);
  }
  std::string path(const std::string& name) const { return join_path(dir_, name); }
  std::string dir_;
};

std::vector<char> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& p, const std::vector<char>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string load_error(const std::string& p) {
  try {
    load_checkpoint(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(CheckpointTest, RoundTripIsBitwiseExact) {
  Graph g = test::small_net();
  GraphModule before(g.clone());
  before->train();
  before->forward(at::randn({4, 3, 8, 8}));  // moves running statistics and num_batches_tracked
  before->eval();
  save_checkpoint(path("a.h5"), before->graph(), "model: small\n", R"({"top1": 0.5})");
  Checkpoint ck = load_checkpoint(path("a.h5"));
  EXPECT_EQ(ck.recipe, "model: small\n");
  EXPECT_EQ(ck.metrics, R"({"top1": 0.5})");
  EXPECT_EQ(ck.whittle_version, version());
  EXPECT_EQ(ck.torch_version, torch_version());
  EXPECT_EQ(ck.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(ck.graph.to_string(), before->graph().to_string());
  EXPECT_EQ(ck.graph.node("features.1").buffers.at("num_batches_tracked").item<int64_t>(), 1);
  GraphModule after(std::move(ck.graph));
  after->eval();
  at::Tensor x = at::randn({5, 3, 8, 8});
  EXPECT_TRUE(at::equal(after->forward(x), before->forward(x)));
  // Loaded parameters are trainable leaves.
  EXPECT_TRUE(after->named_parameters()["features.0.weight"].requires_grad());
  EXPECT_EQ(list_directory(dir_), std::vector<std::string>{"a.h5"});
}

TEST_F(CheckpointTest, MissingAndNonHdf5FilesAreNamed) {
  EXPECT_NE(load_error(path("nope.h5")).find("nope.h5: no such file"), std::string::npos);
  write_bytes(path("text.h5"), {'h', 'e', 'l', 'l', 'o'});
  EXPECT_NE(load_error(path("text.h5")).find("not an HDF5 file"), std::string::npos);
}

TEST_F(CheckpointTest, TruncatedFilesGiveErrors) {
  save_checkpoint(path("a.h5"), test::small_net());
  std::vector<char> bytes = read_bytes(path("a.h5"));
  for (size_t keep : {bytes.size() - 1, bytes.size() * 3 / 4, bytes.size() / 2, size_t{512}, size_t{16}}) {
    write_bytes(path("t.h5"), std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    std::string msg = load_error(path("t.h5"));
    EXPECT_NE(msg.find("t.h5"), std::string::npos) << "kept " << keep << " bytes: '" << msg << "'";
  }
}

TEST_F(CheckpointTest, FlippedTensorBytesAreDetected) {
  Graph g = test::small_net();
  // A distinctive bias so its bytes can be found in the file.
  at::Tensor marker = at::arange(10, at::kFloat).add_(1000.25);
  g.node("classifier").params.set("bias", marker.clone().set_requires_grad(true));
  save_checkpoint(path("a.h5"), g);
  std::vector<char> bytes = read_bytes(path("a.h5"));
  const char* needle = static_cast<const char*>(marker.data_ptr());
  auto it = std::search(bytes.begin(), bytes.end(), needle, needle + marker.nbytes());
  ASSERT_NE(it, bytes.end());
  it[5] ^= 0x10;
  write_bytes(path("flipped.h5"), bytes);
  std::string msg = load_error(path("flipped.h5"));
  EXPECT_NE(msg.find("tensor 'classifier.bias' is corrupted (CRC-32 mismatch)"), std::string::npos) << msg;
}

// Flipping any single byte either leaves the model intact (unused bytes, timestamps) or gives an
// error; it never crashes and never yields different weights silently.
TEST_F(CheckpointTest, ByteFlipSweepNeverLoadsWrongWeights) {
  Graph g = test::small_net();
  save_checkpoint(path("a.h5"), g);
  const std::vector<char> bytes = read_bytes(path("a.h5"));
  GraphModule ref(g.clone());
  ref->eval();
  at::Tensor x = at::randn({2, 3, 8, 8});
  at::Tensor want = ref->forward(x);
  int errors = 0, intact = 0;
  const size_t step = std::getenv("WHITTLE_FULL_SWEEP") ? 1 : std::max<size_t>(1, bytes.size() / 300);
  for (size_t pos = 0; pos < bytes.size(); pos += step) {
    std::vector<char> b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ 0x5a);
    write_bytes(path("f.h5"), b);
    try {
      Checkpoint ck = load_checkpoint(path("f.h5"));
      GraphModule m(std::move(ck.graph));
      m->eval();
      EXPECT_TRUE(at::equal(m->forward(x), want)) << "byte " << pos << " flipped: loaded different weights silently";
      ++intact;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.h5"), std::string::npos) << e.what();
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
  RecordProperty("errors", errors);
  RecordProperty("intact", intact);
}

TEST_F(CheckpointTest, NewerFormatVersionIsRefused) {
  save_checkpoint(path("a.h5"), test::small_net());
  {
    hid_t f = H5Fopen(path("a.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = kCheckpointFormatVersion + 1;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  std::string msg = load_error(path("a.h5"));
  EXPECT_NE(msg.find("newer than this whittle reads"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, FailedWriteLeavesEarlierCheckpointIntact) {
  save_checkpoint(path("a.h5"), test::small_net());
  const std::vector<char> before = read_bytes(path("a.h5"));
  // A graph holding a tensor of a dtype checkpoints cannot store fails mid-write.
  Graph bad = test::small_net();
  bad.node("features.1").buffers.set("extra", at::zeros({2}, at::kComplexFloat));
  try {
    save_checkpoint(path("a.h5"), bad);
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_bytes(path("a.h5")), before);
  EXPECT_EQ(list_directory(dir_), std::vector<std::string>{"a.h5"});
}

TEST_F(CheckpointTest, UnwritableDirectoryIsNamed) {
  try {
    save_checkpoint(path("missing/sub/a.h5"), test::small_net());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace whittle
