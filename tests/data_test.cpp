// whittle::data: readers (MNIST IDX, CIFAR-10 binary, image folders, HDF5), format detection,
// transforms and the loader, with byte-exact hand-made inputs and hand-worked expected values.

#include <dirent.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "data/cifar.h"
#include "data/dataset.h"
#include "data/hdf5_dataset.h"
#include "data/image_archive.h"
#include "data/image_decode.h"
#include "data/image_folder.h"
#include "data/load.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/rng.h"
#include "data/transforms.h"
#include "core/error.h"
#include "core/file_util.h"
#include "support.h"

namespace whittle::data {
namespace {

using Bytes = std::vector<uint8_t>;
using test::all_close;

// POSIX file helpers (std::filesystem is avoided: the LibTorch wheels export their own copies of
// some of its symbols, and std::filesystem::remove_all crashes through them).

std::string parent_of(const std::string& path) { return path.substr(0, path.find_last_of('/')); }

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return;
  make_dirs(parent_of(path));
  ::mkdir(path.c_str(), 0755);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : files_in(path)) remove_tree(path + "/" + name);
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A fresh, empty scratch folder for the running test: <build>/testdata/data_test/<suite>.<test>.
std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = test::binary_dir() + "/testdata/data_test/" + info->test_suite_name() + "." + info->name();
  remove_tree(dir);
  make_dirs(dir);
  return dir;
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  make_dirs(parent_of(path));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

Bytes idx_images(uint32_t n, uint32_t rows, uint32_t cols, const Bytes& pixels) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes idx_labels(const Bytes& labels) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Expects `fn` to throw whittle::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected whittle::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected whittle::Error, nothing was thrown";
}

at::Tensor longs(const std::vector<int64_t>& values) { return at::tensor(values, at::kLong); }

at::Tensor u8(const std::vector<int>& values, at::IntArrayRef shape) {
  return at::tensor(values, at::kInt).to(at::kByte).reshape(shape);
}

// ---- image writers (libpng simplified API, TurboJPEG) ----

// hwc: interleaved rows, channels 1 (gray), 3 (RGB) or 4 (RGBA).
void write_png(const std::string& path, int width, int height, int channels, const Bytes& hwc) {
  make_dirs(parent_of(path));
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  ASSERT_NE(png_image_write_to_file(&image, path.c_str(), 0, hwc.data(), 0, nullptr), 0) << image.message;
}

// Quality 100 with no chroma subsampling (4:4:4), or a gray JPEG for channels 1.
Bytes encode_jpeg(int width, int height, int channels, const Bytes& hwc) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, hwc.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                             channels == 1 ? TJSAMP_GRAY : TJSAMP_444, 100, 0);
  Bytes out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  EXPECT_EQ(rc, 0) << "tjCompress2 failed";
  return out;
}

// HWC bytes to a uint8 [C, H, W] tensor.
at::Tensor chw(const Bytes& hwc, int64_t height, int64_t width, int64_t channels) {
  return at::tensor(std::vector<int>(hwc.begin(), hwc.end()), at::kInt)
      .to(at::kByte)
      .reshape({height, width, channels})
      .permute({2, 0, 1})
      .contiguous();
}

// =====================================================================================
// MNIST IDX
// =====================================================================================

class DataIdx : public test::SeededTest {};

const Bytes kPixels = {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255};

TEST_F(DataIdx, RawFilesGiveKnownBytes) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/img", idx_images(2, 2, 3, kPixels));
  write_bytes(dir + "/lab", idx_labels({7, 3}));
  Dataset d = read_mnist(dir + "/img", dir + "/lab");
  EXPECT_EQ(d.images.sizes(), at::IntArrayRef({2, 1, 2, 3}));
  EXPECT_TRUE(at::equal(d.images, u8({0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255}, {2, 1, 2, 3})));
  EXPECT_TRUE(at::equal(d.labels, longs({7, 3})));
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
}

TEST_F(DataIdx, GzippedFilesGiveTheSameBytes) {
  const std::string dir = scratch_dir();
  write_gzip(dir + "/img.gz", idx_images(2, 2, 3, kPixels));
  write_gzip(dir + "/lab.gz", idx_labels({7, 3}));
  Dataset d = read_mnist(dir + "/img.gz", dir + "/lab.gz");
  EXPECT_TRUE(at::equal(d.images, u8({0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255}, {2, 1, 2, 3})));
  EXPECT_TRUE(at::equal(d.labels, longs({7, 3})));
}

TEST_F(DataIdx, BadMagicNamesTheFile) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/lab", idx_labels({1, 2}));
  write_bytes(dir + "/img", idx_images(2, 2, 3, kPixels));
  expect_error([&] { read_idx_images(dir + "/lab"); }, {dir + "/lab", "bad magic 0x00000801", "0x00000803"});
  expect_error([&] { read_idx_labels(dir + "/img"); }, {dir + "/img", "bad magic 0x00000803", "0x00000801"});
}

TEST_F(DataIdx, TruncatedAndOverlongFilesNameTheFile) {
  const std::string dir = scratch_dir();
  Bytes img = idx_images(2, 2, 3, kPixels);
  Bytes cut(img.begin(), img.end() - 1);
  write_bytes(dir + "/cut", cut);
  expect_error([&] { read_idx_images(dir + "/cut"); }, {dir + "/cut", "truncated", "27 bytes"});
  write_bytes(dir + "/header", Bytes(img.begin(), img.begin() + 10));
  expect_error([&] { read_idx_images(dir + "/header"); }, {dir + "/header", "truncated IDX header"});
  Bytes longer = img;
  longer.push_back(9);
  write_bytes(dir + "/long", longer);
  expect_error([&] { read_idx_images(dir + "/long"); }, {dir + "/long", "trailing bytes"});
  Bytes lab = idx_labels({1, 2, 3});
  write_bytes(dir + "/labcut", Bytes(lab.begin(), lab.end() - 2));
  expect_error([&] { read_idx_labels(dir + "/labcut"); }, {dir + "/labcut", "truncated"});
}

TEST_F(DataIdx, ImplausibleSizesAreRefusedBeforeAllocating) {
  // Found by fuzz_idx (tests/fuzz/regressions/idx/): zero images of 4278190079 × 4294967295
  // pixels matched the 16-byte file and then overflowed the tensor's strides (a c10::Error).
  const std::string dir = scratch_dir();
  write_bytes(dir + "/zero", idx_images(0, 0xfeffffffu, 0xffffffffu, {}));
  expect_error([&] { read_idx_images(dir + "/zero"); }, {dir + "/zero", "[0, 4278190079, 4294967295]", "implausibly large"});
  // Three images of 2^31 × 2^31 pixels (their product wraps around 2^64).
  write_bytes(dir + "/wrap", idx_images(3, 0x80000000u, 0x80000000u, {}));
  expect_error([&] { read_idx_images(dir + "/wrap"); }, {dir + "/wrap", "implausibly large"});
  // An empty file of 28×28 images is still read.
  write_bytes(dir + "/empty", idx_images(0, 28, 28, {}));
  EXPECT_EQ(read_idx_images(dir + "/empty").sizes(), (std::vector<int64_t>{0, 1, 28, 28}));
}

TEST_F(DataIdx, TruncatedGzipNamesTheFile) {
  const std::string dir = scratch_dir();
  // 2000 pseudo-random pixels compress poorly, so cutting the stream in half loses data.
  Bytes pixels(2000);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 7919u + 13u) % 251u);
  write_gzip(dir + "/img.gz", idx_images(20, 10, 10, pixels));
  Bytes gz = read_bytes(dir + "/img.gz");
  write_bytes(dir + "/cut.gz", Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  expect_error([&] { read_idx_images(dir + "/cut.gz"); }, {dir + "/cut.gz"});
  EXPECT_EQ(read_idx_images(dir + "/img.gz").size(0), 20);
}

TEST_F(DataIdx, CountMismatchAndBadLabelsNameTheFiles) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/img", idx_images(2, 2, 3, kPixels));
  write_bytes(dir + "/lab3", idx_labels({1, 2, 3}));
  expect_error([&] { read_mnist(dir + "/img", dir + "/lab3"); },
               {"count mismatch", dir + "/img", "2 images", dir + "/lab3", "3 labels"});
  write_bytes(dir + "/lab10", idx_labels({1, 10}));
  expect_error([&] { read_mnist(dir + "/img", dir + "/lab10"); }, {dir + "/lab10", "label 10", "sample 1"});
  expect_error([&] { read_mnist(dir + "/nope", dir + "/lab3"); }, {dir + "/nope", "cannot open"});
  expect_error([&] { load_mnist(dir, "train"); }, {"train-images-idx3-ubyte", "no such file"});
  expect_error([&] { load_mnist(dir, "valid"); }, {"unknown MNIST split 'valid'"});
}

TEST_F(DataIdx, BundledDigitsHaveTheDocumentedClassCounts) {
  const std::string dir = test::source_dir() + "/data/mnist10k";
  Dataset train = load_mnist(dir, "train");
  EXPECT_EQ(train.images.sizes(), at::IntArrayRef({8000, 1, 28, 28}));
  EXPECT_EQ(train.class_counts(), (std::vector<int64_t>{801, 902, 793, 826, 784, 690, 811, 856, 755, 782}));
  Dataset test = load_mnist(dir, "t10k");
  EXPECT_EQ(test.images.sizes(), at::IntArrayRef({2000, 1, 28, 28}));
  EXPECT_EQ(test.class_counts(), (std::vector<int64_t>{200, 225, 198, 206, 196, 173, 203, 214, 189, 196}));
  // Real digits: black background, white strokes.
  EXPECT_EQ(train.images.min().item<int>(), 0);
  EXPECT_EQ(train.images.max().item<int>(), 255);
  EXPECT_EQ(train.images.select(2, 0).max().item<int>(), 0);  // the top row is background

  LoadOptions o;
  o.split = "test";
  EXPECT_EQ(detect_format(dir, o), DatasetFormat::kMnistIdx);
  Dataset auto_test = load_dataset(dir, o);
  EXPECT_TRUE(at::equal(auto_test.images, test.images));
  EXPECT_TRUE(at::equal(auto_test.labels, test.labels));
  // A single images file finds its labels file.
  Dataset single = load_dataset(dir + "/t10k-images-idx3-ubyte.gz");
  EXPECT_TRUE(at::equal(single.labels, test.labels));
  expect_error([&] { load_dataset(dir + "/t10k-labels-idx1-ubyte.gz"); }, {"is an IDX labels file"});
}

// =====================================================================================
// CIFAR-10 binary
// =====================================================================================

class DataCifar : public test::SeededTest {};

// Record r of a test batch: label `label`, pixel k = (r·31 + k·7) mod 256.
Bytes cifar_record(int label, int r) {
  Bytes rec{static_cast<uint8_t>(label)};
  for (int k = 0; k < 3072; ++k) rec.push_back(static_cast<uint8_t>((r * 31 + k * 7) % 256));
  return rec;
}

TEST_F(DataCifar, ReadsRecordsInPlanarLayout) {
  const std::string dir = scratch_dir();
  Bytes batch;
  for (int r : {0, 1, 2}) {
    Bytes rec = cifar_record(r * 4, r);
    batch.insert(batch.end(), rec.begin(), rec.end());
  }
  write_bytes(dir + "/b.bin", batch);
  Dataset d = read_cifar10({dir + "/b.bin"});
  EXPECT_EQ(d.images.sizes(), at::IntArrayRef({3, 3, 32, 32}));
  EXPECT_TRUE(at::equal(d.labels, longs({0, 4, 8})));
  EXPECT_EQ(d.class_names[3], "cat");
  // Record 1: red (0, 0) is pixel byte 0, red (0, 1) byte 1, green (0, 0) byte 1024, blue (31, 31) byte 3071.
  EXPECT_EQ(d.images[1][0][0][0].item<int>(), 31);
  EXPECT_EQ(d.images[1][0][0][1].item<int>(), (31 + 7) % 256);
  EXPECT_EQ(d.images[1][1][0][0].item<int>(), (31 + 1024 * 7) % 256);
  EXPECT_EQ(d.images[1][2][31][31].item<int>(), (31 + 3071 * 7) % 256);
}

TEST_F(DataCifar, SplitsOfABatchFolder) {
  const std::string root = scratch_dir();
  const std::string dir = root + "/cifar-10-batches-bin";
  for (int k = 1; k <= 5; ++k) {
    Bytes batch;
    for (int r = 0; r < 2; ++r) {
      Bytes rec = cifar_record((k + r) % 10, 10 * k + r);
      batch.insert(batch.end(), rec.begin(), rec.end());
    }
    write_bytes(dir + "/data_batch_" + std::to_string(k) + ".bin", batch);
  }
  write_bytes(dir + "/test_batch.bin", cifar_record(9, 99));
  Dataset train = load_cifar10(root, "train");
  EXPECT_EQ(train.size(), 10);
  EXPECT_TRUE(at::equal(train.labels, longs({1, 2, 2, 3, 3, 4, 4, 5, 5, 6})));
  EXPECT_EQ(train.images[9][0][0][0].item<int>(), (51 * 31) % 256);  // data_batch_5, record 1
  Dataset test = load_dataset(root, {"test"});
  EXPECT_EQ(test.size(), 1);
  EXPECT_EQ(test.labels[0].item<int64_t>(), 9);
  EXPECT_EQ(detect_format(root, {}), DatasetFormat::kCifar10Binary);
  EXPECT_EQ(load_dataset(dir + "/test_batch.bin").size(), 1);
}

TEST_F(DataCifar, TruncatedAndBadLabelsNameTheFile) {
  const std::string dir = scratch_dir();
  Bytes two = cifar_record(1, 0);
  Bytes second = cifar_record(2, 1);
  two.insert(two.end(), second.begin(), second.end());
  write_bytes(dir + "/cut.bin", Bytes(two.begin(), two.end() - 100));
  expect_error([&] { read_cifar10({dir + "/cut.bin"}); }, {dir + "/cut.bin", "truncated", "3073-byte records"});
  two[3073] = 10;
  write_bytes(dir + "/label.bin", two);
  expect_error([&] { read_cifar10({dir + "/label.bin"}); }, {dir + "/label.bin", "record 1", "label 10"});
  write_bytes(dir + "/empty.bin", {});
  expect_error([&] { read_cifar10({dir + "/empty.bin"}); }, {dir + "/empty.bin", "empty"});
  expect_error([&] { load_cifar10(dir, "train"); }, {"data_batch_1.bin", "no such file"});
}

// =====================================================================================
// Image folders (PNG exact, JPEG within tolerance)
// =====================================================================================

class DataImageFolder : public test::SeededTest {};

// JPEG tolerance, in pixel levels. The test JPEGs are quality 100 with 4:4:4 sampling (quantizer
// step 1 for every coefficient) and hold one solid colour per 8×8 block, so only the DC terms are
// non-zero and the DCT round trip is exact up to rounding; what remains is the integer rounding of
// the RGB→YCbCr conversion when encoding and of YCbCr→RGB when decoding, at most 1 level each.
constexpr double kJpegTolerance = 2.0;

struct FolderImages {
  Bytes rgb_png, rgb_jpeg, gray_jpeg, gray_png, rgba_png;
};

// root/bird/a.png (RGB gradient), root/bird/b.JPG (solid RGB), root/cat/c.jpeg (solid gray),
// root/cat/d.png (gray gradient), root/cat/e.png (RGBA, alpha dropped), plus files to ignore.
FolderImages make_folder(const std::string& root) {
  FolderImages im;
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) {
      im.rgb_png.insert(im.rgb_png.end(), {static_cast<uint8_t>(x * 30), static_cast<uint8_t>(y * 30),
                                           static_cast<uint8_t>((x + y) * 10 + 5)});
      im.rgb_jpeg.insert(im.rgb_jpeg.end(), {200, 40, 90});
      im.gray_jpeg.push_back(77);
      im.gray_png.push_back(static_cast<uint8_t>(x * 8 + y));
      im.rgba_png.insert(im.rgba_png.end(), {static_cast<uint8_t>(255 - x), static_cast<uint8_t>(y), 9,
                                             static_cast<uint8_t>(x * 32)});
    }
  write_png(root + "/bird/a.png", 8, 8, 3, im.rgb_png);
  write_bytes(root + "/bird/b.JPG", encode_jpeg(8, 8, 3, im.rgb_jpeg));
  write_bytes(root + "/cat/c.jpeg", encode_jpeg(8, 8, 1, im.gray_jpeg));
  write_png(root + "/cat/d.png", 8, 8, 1, im.gray_png);
  write_png(root + "/cat/e.png", 8, 8, 4, im.rgba_png);
  write_bytes(root + "/cat/notes.txt", {'h', 'i'});
  write_bytes(root + "/cat/.hidden.png", {'x'});
  make_dirs(root + "/.cache");
  return im;
}

TEST_F(DataImageFolder, DecodesPngExactlyAndJpegWithinTolerance) {
  const std::string root = scratch_dir() + "/images";
  FolderImages im = make_folder(root);
  ImageFolderOptions o;
  o.num_threads = 2;
  Dataset d = read_image_folder(root, o);
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"bird", "cat"}));
  EXPECT_TRUE(at::equal(d.labels, longs({0, 0, 1, 1, 1})));
  ASSERT_EQ(d.images.sizes(), at::IntArrayRef({5, 3, 8, 8}));  // RGB, as the first image (a.png)
  EXPECT_TRUE(at::equal(d.images[0], chw(im.rgb_png, 8, 8, 3)));
  EXPECT_TRUE(all_close(d.images[1], chw(im.rgb_jpeg, 8, 8, 3), kJpegTolerance, 0));
  EXPECT_TRUE(all_close(d.images[2], at::full({3, 8, 8}, 77, at::kByte), kJpegTolerance, 0));
  EXPECT_TRUE(at::equal(d.images[3], chw(im.gray_png, 8, 8, 1).expand({3, 8, 8})));
  Bytes rgb_of_rgba;
  for (size_t i = 0; i < im.rgba_png.size(); i += 4) rgb_of_rgba.insert(rgb_of_rgba.end(), {im.rgba_png[i], im.rgba_png[i + 1], im.rgba_png[i + 2]});
  EXPECT_TRUE(at::equal(d.images[4], chw(rgb_of_rgba, 8, 8, 3)));
  EXPECT_EQ(detect_format(root, {}), DatasetFormat::kImageFolder);
}

TEST_F(DataImageFolder, ConvertsToGrayWithBt601Luma) {
  const std::string root = scratch_dir() + "/images";
  FolderImages im = make_folder(root);
  ImageFolderOptions o;
  o.channels = 1;
  o.num_threads = 1;
  Dataset d = read_image_folder(root, o);
  ASSERT_EQ(d.images.sizes(), at::IntArrayRef({5, 1, 8, 8}));
  // a.png pixel (y=2, x=3) = (90, 60, 55): (19595·90 + 38470·60 + 7471·55 + 32768) >> 16
  // = 4515423 >> 16 = 68 (0.299·90 + 0.587·60 + 0.114·55 = 68.4).
  EXPECT_EQ(d.images[0][0][2][3].item<int>(), 68);
  // b.JPG (200, 40, 90): luma 0.299·200 + 0.587·40 + 0.114·90 = 93.54.
  EXPECT_NEAR(d.images[1].to(at::kDouble).mean().item<double>(), 93.54, kJpegTolerance);
  EXPECT_TRUE(all_close(d.images[2][0], at::full({8, 8}, 77, at::kByte), kJpegTolerance, 0));
  EXPECT_TRUE(at::equal(d.images[3], chw(im.gray_png, 8, 8, 1)));
}

// An image folder inside a .tar.gz (<prefix>/<split>/<class>/<image>, as the CIFAR-10 JPEG archive
// ships): the same images, labels and class order as the extracted folder, through
// read_image_archive and through the auto-detecting load_dataset; a missing split lists the
// splits the archive has.
TEST_F(DataImageFolder, ArchiveReadsLikeTheExtractedFolder) {
  const std::string base = scratch_dir();
  make_folder(base + "/src/set/test");
  write_png(base + "/src/set/train/bird/z.png", 8, 8, 3, Bytes(8 * 8 * 3, 50));
  const std::string archive = base + "/set.tar.gz";
  ASSERT_EQ(std::system(("tar -czf " + archive + " -C " + base + "/src set").c_str()), 0);
  ImageFolderOptions o;
  o.num_threads = 2;
  const Dataset folder = read_image_folder(base + "/src/set/test", o);
  const Dataset packed = read_image_archive(archive, "test", o);
  EXPECT_EQ(packed.class_names, folder.class_names);
  EXPECT_TRUE(at::equal(packed.labels, folder.labels));
  EXPECT_TRUE(at::equal(packed.images, folder.images));
  EXPECT_EQ(detect_format(archive, {"test"}), DatasetFormat::kImageArchive);
  const Dataset loaded = load_dataset(archive, {"test"});
  EXPECT_TRUE(at::equal(loaded.images, folder.images));
  EXPECT_EQ(load_dataset(archive, {"train"}).size(), 1);
  expect_error([&] { read_image_archive(archive, "val"); }, {archive, "val", "test", "train"});
}

TEST_F(DataImageFolder, OddSizeNamesTheFile) {
  const std::string root = scratch_dir();
  write_png(root + "/x/0.png", 8, 8, 1, Bytes(64, 1));
  write_png(root + "/x/1.png", 8, 8, 1, Bytes(64, 2));
  write_png(root + "/y/2.png", 6, 8, 1, Bytes(48, 3));  // width 6, height 8
  write_png(root + "/y/3.png", 5, 8, 1, Bytes(40, 3));
  expect_error([&] { read_image_folder(root); }, {root + "/y/2.png", "6x8", "expected 8x8", root + "/x/0.png"});
}

TEST_F(DataImageFolder, UndecodableImagesNameTheFirstBadFile) {
  const std::string base = scratch_dir();
  const std::string root = base + "/garbage";
  write_png(root + "/x/0.png", 8, 8, 1, Bytes(64, 1));
  write_bytes(root + "/x/1.jpg", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  write_bytes(root + "/x/2.jpg", {'n', 'o'});
  for (int threads : {1, 2})
    expect_error([&] { read_image_folder(root, {0, threads}); }, {root + "/x/1.jpg", "not a JPEG or PNG"});

  const std::string root2 = base + "/truncated";
  Bytes jpeg = encode_jpeg(16, 16, 3, Bytes(16 * 16 * 3, 120));
  write_bytes(root2 + "/x/0.jpg", jpeg);
  write_bytes(root2 + "/x/1.jpg", Bytes(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() * 2 / 3)));
  expect_error([&] { read_image_folder(root2); }, {root2 + "/x/1.jpg", "JPEG"});
  // Cut inside the entropy-coded data: libjpeg only warns ("premature end"), whittle refuses.
  write_bytes(root2 + "/x/1.jpg", Bytes(jpeg.begin(), jpeg.end() - 10));
  expect_error([&] { read_image_folder(root2); }, {root2 + "/x/1.jpg", "undecodable JPEG"});
  const std::string root3 = base + "/truncated_png";
  Bytes png = read_bytes(root + "/x/0.png");
  write_bytes(root3 + "/x/0.png", png);
  write_bytes(root3 + "/x/1.png", Bytes(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() - 20)));
  expect_error([&] { read_image_folder(root3); }, {root3 + "/x/1.png", "PNG"});
}

TEST_F(DataImageFolder, EmptyOrMissingFolders) {
  const std::string root = scratch_dir();
  expect_error([&] { read_image_folder(root + "/missing"); }, {root + "/missing", "not a folder"});
  expect_error([&] { read_image_folder(root); }, {root, "no class subfolders"});
  make_dirs(root + "/a");
  expect_error([&] { read_image_folder(root); }, {root, "no .jpg, .jpeg or .png files"});
}

TEST_F(DataImageFolder, SplitSubfolderIsDetected) {
  const std::string root = scratch_dir();
  write_png(root + "/train/a/0.png", 4, 4, 1, Bytes(16, 10));
  write_png(root + "/train/b/0.png", 4, 4, 1, Bytes(16, 20));
  write_png(root + "/test/a/0.png", 4, 4, 1, Bytes(16, 30));
  std::string resolved;
  EXPECT_EQ(detect_format(root, {"test"}, &resolved), DatasetFormat::kImageFolder);
  EXPECT_EQ(resolved, root + "/test");
  Dataset train = load_dataset(root);
  EXPECT_EQ(train.size(), 2);
  EXPECT_EQ(train.images[1][0][0][0].item<int>(), 20);
  EXPECT_EQ(load_dataset(root, {"test"}).images[0][0][0][0].item<int>(), 30);
  expect_error([&] { load_dataset(root + "/nothing"); }, {root + "/nothing", "no such file or folder"});
}

// =====================================================================================
// HDF5
// =====================================================================================

class DataHdf5 : public test::SeededTest {};

Dataset random_dataset(int64_t n, int64_t c, int64_t h, int64_t w, int64_t classes) {
  Dataset d;
  d.images = at::randint(0, 256, {n, c, h, w}, at::kByte);
  d.labels = at::randint(0, classes, {n}, at::kLong);
  for (int64_t k = 0; k < classes; ++k) d.class_names.push_back("class_" + std::to_string(k));
  return d;
}

TEST_F(DataHdf5, RoundTripIsExact) {
  const std::string dir = scratch_dir();
  Dataset d = random_dataset(7, 3, 5, 4, 3);
  d.class_names = {"cat", "dog", "\xc3\xbcn\xc3\xaf" "code"};
  for (int level : {0, 6}) {
    const std::string path = dir + "/d" + std::to_string(level) + ".h5";
    write_hdf5_dataset(d, path, {level});
    Dataset r = read_hdf5_dataset(path);
    EXPECT_TRUE(at::equal(r.images, d.images));
    EXPECT_TRUE(at::equal(r.labels, d.labels));
    EXPECT_EQ(r.class_names, d.class_names);
    EXPECT_TRUE(is_hdf5_file(path));
    EXPECT_EQ(detect_format(path, {}), DatasetFormat::kHdf5);
  }
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"d0.h5", "d6.h5"}));  // no temporary left
  // Overwriting replaces the file; a gray dataset without class names round-trips too.
  Dataset g = random_dataset(3, 1, 2, 2, 2);
  g.class_names.clear();
  write_hdf5_dataset(g, dir + "/d0.h5");
  Dataset r = load_dataset(dir + "/d0.h5");
  EXPECT_TRUE(at::equal(r.images, g.images));
  EXPECT_TRUE(r.class_names.empty());
}

TEST_F(DataHdf5, TruncatedOrForeignFilesGiveCleanErrors) {
  const std::string dir = scratch_dir();
  write_hdf5_dataset(random_dataset(50, 3, 8, 8, 4), dir + "/good.h5");
  Bytes good = read_bytes(dir + "/good.h5");
  write_bytes(dir + "/cut.h5", Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)));
  expect_error([&] { read_hdf5_dataset(dir + "/cut.h5"); }, {dir + "/cut.h5", "HDF5"});
  write_bytes(dir + "/head.h5", Bytes(good.begin(), good.begin() + 100));
  expect_error([&] { read_hdf5_dataset(dir + "/head.h5"); }, {dir + "/head.h5"});
  write_bytes(dir + "/text.h5", {'h', 'e', 'l', 'l', 'o'});
  expect_error([&] { read_hdf5_dataset(dir + "/text.h5"); }, {dir + "/text.h5", "not an HDF5 file"});
  expect_error([&] { read_hdf5_dataset(dir + "/none.h5"); }, {dir + "/none.h5", "no such file"});
}

// Found by fuzz_hdf5_dataset (tests/fuzz/regressions/hdf5_dataset/): libhdf5 1.10 follows a
// class name's reference into the global heap without checking the object index, and read past
// the collection's table. Each reference is now checked against the collections first.
TEST_F(DataHdf5, ADamagedStringReferenceIsRefusedBeforeHdf5FollowsIt) {
  const std::string dir = scratch_dir();
  Dataset d = random_dataset(6, 1, 4, 4, 3);
  d.class_names = {"zero", "one", "two"};
  write_hdf5_dataset(d, dir + "/good.h5");
  EXPECT_EQ(read_hdf5_dataset(dir + "/good.h5").class_names, d.class_names);
  Bytes bytes = read_bytes(dir + "/good.h5");
  const std::string text(bytes.begin(), bytes.end());
  const size_t heap = text.find("GCOL");
  ASSERT_NE(heap, std::string::npos) << "the class names are variable-length strings in a global heap";
  // The references: length (u32), the collection's address (u64), the object index (u32).
  std::string address(8, '\0');
  for (int i = 0; i < 8; ++i) address[static_cast<size_t>(i)] = static_cast<char>((heap >> (8 * i)) & 0xff);
  int references = 0;
  for (size_t at = text.find(address); at != std::string::npos; at = text.find(address, at + 1)) {
    if (at < 4 || at + 12 > bytes.size()) continue;
    ++references;
    bytes[at + 8] = 0x39;  // object index 57: no such object
    bytes[at + 9] = 0;
  }
  EXPECT_EQ(references, 4) << "the three class names and the format attribute";
  write_bytes(dir + "/damaged.h5", bytes);
  expect_error([&] { read_hdf5_dataset(dir + "/damaged.h5"); },
               {dir + "/damaged.h5", "attribute class_names: string 0 refers to no object of the global heap (object 57"});
}

TEST_F(DataHdf5, FailedWriteLeavesNothing) {
  const std::string dir = scratch_dir();
  expect_error([&] { write_hdf5_dataset(random_dataset(2, 1, 2, 2, 2), dir + "/missing/x.h5"); },
               {dir + "/missing/x.h5", "the folder " + dir + "/missing is missing"});
  Dataset bad = random_dataset(2, 1, 2, 2, 2);
  bad.labels = longs({0, 5});
  expect_error([&] { write_hdf5_dataset(bad, dir + "/bad.h5"); }, {dir + "/bad.h5", "label 5", "sample 1"});
  EXPECT_TRUE(files_in(dir).empty());
}

// The atomic writer replaces regular files only: a FIFO (standing in for /dev/null or /dev/full,
// which a rename would replace with a regular file) or a directory is refused before writing,
// and stays what it was.
TEST_F(DataHdf5, WritersRefuseADestinationThatIsNotARegularFile) {
  const std::string dir = scratch_dir();
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  make_directories(dir + "/folder");
  auto is_fifo = [&] {
    struct stat st {};
    return ::stat(fifo.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  };
  expect_error([&] { write_hdf5_dataset(random_dataset(2, 1, 2, 2, 2), fifo); }, {fifo, "a FIFO", "not a regular file"});
  expect_error([&] { write_file_atomic(fifo, "x"); }, {fifo, "a FIFO"});
  expect_error([&] { write_file_atomic(dir + "/folder", "x"); }, {dir + "/folder", "a directory"});
  EXPECT_TRUE(is_fifo());
  EXPECT_TRUE(is_directory(dir + "/folder"));
  // Nothing else was written beside them (no temporary left behind).
  std::vector<std::string> names = list_directory(dir);
  EXPECT_EQ(names, (std::vector<std::string>{"fifo", "folder"}));
  // A regular file, and a symlink to one, are still replaced.
  write_file_atomic(dir + "/plain.txt", "a");
  ASSERT_EQ(::symlink((dir + "/plain.txt").c_str(), (dir + "/link.txt").c_str()), 0);
  write_file_atomic(dir + "/link.txt", "b");
  EXPECT_EQ(read_file(dir + "/link.txt"), "b");
}

TEST_F(DataHdf5, PackImageFolderToHdf5) {
  const std::string dir = scratch_dir();
  make_folder(dir + "/images");
  Dataset packed = pack_dataset(dir + "/images", dir + "/packed.h5", {}, {4});
  Dataset r = load_dataset(dir + "/packed.h5");
  EXPECT_TRUE(at::equal(r.images, packed.images));
  EXPECT_TRUE(at::equal(r.labels, packed.labels));
  EXPECT_EQ(r.class_names, (std::vector<std::string>{"bird", "cat"}));
  expect_error([&] { pack_dataset(dir + "/nothing", dir + "/no.h5"); }, {dir + "/nothing"});
  EXPECT_FALSE(exists(dir + "/no.h5"));
}

// Run by tests/reference/data_hdf5_check.py, which writes files with h5py (and an image folder
// with PIL) into $WHITTLE_DATA_H5PY_DIR first and checks the files written here with h5py (and
// the packed images against PIL's decoding) afterwards.
// Pattern: images [5, 3, 4, 6] with flat element k = (37·k + 11) mod 256, labels [2, 0, 1, 2, 1].
TEST(DataHdf5Python, ReadsH5pyFilesAndWritesForH5py) {
  const char* env = std::getenv("WHITTLE_DATA_H5PY_DIR");
  if (env == nullptr) GTEST_SKIP() << "run by tests/reference/data_hdf5_check.py";
  const std::string dir = env;
  Dataset expected;
  expected.images = at::arange(5 * 3 * 4 * 6, at::kLong).mul(37).add(11).remainder(256).to(at::kByte).reshape({5, 3, 4, 6});
  expected.labels = longs({2, 0, 1, 2, 1});
  expected.class_names = {"cat", "dog", "\xc3\xbcn\xc3\xaf"};
  for (const char* name : {"from_h5py_attr.h5", "from_h5py_fixed.h5"}) {
    Dataset r = read_hdf5_dataset(dir + "/" + name);
    EXPECT_TRUE(at::equal(r.images, expected.images)) << name;
    EXPECT_TRUE(at::equal(r.labels, expected.labels)) << name;
    EXPECT_EQ(r.class_names, expected.class_names) << name;
  }
  expect_error([&] { read_hdf5_dataset(dir + "/future.h5"); }, {dir + "/future.h5", "format_version 2", "upgrade"});
  write_hdf5_dataset(expected, dir + "/whittle.h5");
  write_hdf5_dataset(expected, dir + "/whittle_gzip.h5", {4});
  LoadOptions rgb;
  rgb.channels = 3;
  pack_dataset(dir + "/pil_folder", dir + "/pil_folder.h5", rgb);
}

// =====================================================================================
// Transforms
// =====================================================================================

class DataTransforms : public test::SeededTest {};

TEST_F(DataTransforms, NormalizeKnownPixels) {
  // Channel 0 pixels 0, 51, 255 with mean 0.2, stddev 0.5: (0 − 0.2)/0.5 = −0.4, (0.2 − 0.2)/0.5 = 0,
  // (1 − 0.2)/0.5 = 1.6. Channel 1 pixels 255, 102, 0 with mean 0.4, stddev 0.2: 3, 0, −2.
  at::Tensor x = u8({0, 51, 255, 255, 102, 0}, {1, 2, 1, 3});
  at::Tensor y = normalize(x, {0.2, 0.4}, {0.5, 0.2});
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_TRUE(all_close(y, at::tensor(std::vector<float>{-0.4f, 0.f, 1.6f, 3.f, 0.f, -2.f}).reshape({1, 2, 1, 3}), 1e-6, 0));
  // No mean/stddev: plain division by 255; one value applies to every channel.
  EXPECT_TRUE(all_close(normalize(x, {}, {}), x.to(at::kFloat) / 255, 1e-7, 0));
  EXPECT_TRUE(all_close(normalize(x[0], {0.5}, {0.5}), x[0].to(at::kFloat) / 127.5 - 1, 1e-6, 0));
  expect_error([&] { normalize(x, {0.1, 0.2, 0.3}, {}); }, {"mean has 3 values for 2 channels"});
  expect_error([&] { normalize(x, {}, {0.0}); }, {"stddev of channel 0 must be > 0"});
}

TEST_F(DataTransforms, PadCropAtAKnownOffset) {
  // 3×3 image 1..9 zero-padded by 1 to 5×5; the 3×3 window at top 0, left 2 covers padded rows
  // 0..2 and columns 2..4: [0 0 0; 2 3 0; 5 6 0].
  at::Tensor x = u8({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  EXPECT_TRUE(at::equal(pad_crop(x, 1, 0, 2, 3, 3), u8({0, 0, 0, 2, 3, 0, 5, 6, 0}, {1, 1, 3, 3})));
  EXPECT_TRUE(at::equal(pad_crop(x, 1, 1, 1, 3, 3), x));
  EXPECT_TRUE(at::equal(pad_crop(x, 0, 1, 0, 2, 2), u8({4, 5, 7, 8}, {1, 1, 2, 2})));
  expect_error([&] { pad_crop(x, 1, 0, 3, 3, 3); }, {"does not fit"});
}

TEST_F(DataTransforms, HorizontalFlipMirrorsColumns) {
  at::Tensor x = u8({1, 2, 3, 4, 5, 6}, {1, 1, 2, 3});
  EXPECT_TRUE(at::equal(horizontal_flip(x), u8({3, 2, 1, 6, 5, 4}, {1, 1, 2, 3})));
  Rng rng(1);
  EXPECT_TRUE(at::equal(random_horizontal_flip(x, 1.0, rng), horizontal_flip(x)));
  EXPECT_TRUE(at::equal(random_horizontal_flip(x, 0.0, rng), x));
}

TEST_F(DataTransforms, RandomCropUsesTheDocumentedDraws) {
  at::Tensor x = at::randint(0, 256, {4, 3, 6, 5}, at::kByte);
  Rng rng(7), replay(7);
  at::Tensor y = random_crop(x, 4, 5, 2, rng);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({4, 3, 4, 5}));
  for (int64_t n = 0; n < 4; ++n) {
    const auto top = static_cast<int64_t>(replay.uniform_int(6 + 4 - 4 + 1));
    const auto left = static_cast<int64_t>(replay.uniform_int(5 + 4 - 5 + 1));
    EXPECT_TRUE(at::equal(y[n], pad_crop(x.narrow(0, n, 1), 2, top, left, 4, 5)[0])) << n;
  }
  EXPECT_EQ(rng.next(), replay.next());  // exactly 2 draws per sample
}

TEST_F(DataTransforms, FusedBatchTransformEqualsTheComposition) {
  at::Tensor images = at::randint(0, 256, {9, 3, 7, 6}, at::kByte);
  at::Tensor indices = longs({8, 0, 3, 3, 5});
  Transform t;
  t.padding = 2;
  t.crop_height = 6;
  t.flip_probability = 0.5;
  t.mean = {0.49, 0.48, 0.45};
  t.stddev = {0.25, 0.24, 0.26};
  for (uint64_t seed : {0, 1, 2, 3}) {
    Rng a(seed), b(seed);
    at::Tensor fused = transform_batch(images, indices, t, a);
    at::Tensor gathered = images.index_select(0, indices);
    at::Tensor expected = normalize(
        random_horizontal_flip(random_crop(gathered, 6, 6, 2, b), t.flip_probability, b), t.mean, t.stddev);
    EXPECT_TRUE(at::equal(fused, expected)) << "seed " << seed;
    EXPECT_EQ(a.next(), b.next());
  }
  // Without crop or flip, the transform is a plain normalization and draws nothing.
  Transform plain;
  plain.mean = {0.5};
  plain.stddev = {0.25};
  Rng a(3), b(3);
  EXPECT_TRUE(at::equal(apply_transform(images, plain, a), normalize(images, {0.5}, {0.25})));
  EXPECT_EQ(a.next(), b.next());
  t.crop_height = 12;
  expect_error([&] { apply_transform(images, t, a); }, {"crop 12x6", "larger than the padded 11x10"});
}

TEST_F(DataTransforms, StreamsAreDistinctPerBatchAndEpoch) {
  std::set<uint64_t> keys, firsts;
  for (uint64_t epoch = 0; epoch < 4; ++epoch)
    for (uint64_t b = 0; b < 2000; ++b) {
      keys.insert(stream_key(42, epoch, b));
      firsts.insert(Rng::stream(42, epoch, b).next());
    }
  EXPECT_EQ(keys.size(), 8000u);
  EXPECT_EQ(firsts.size(), 8000u);
  EXPECT_NE(stream_key(1, 0, 0), stream_key(2, 0, 0));
  EXPECT_NE(stream_key(0, 0, kShuffleStream), stream_key(0, 0, 0));
  // uniform_int stays in range, uniform in [0, 1).
  Rng rng(5);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_LT(rng.uniform_int(7), 7u);
    const double u = rng.uniform();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// =====================================================================================
// Loader
// =====================================================================================

class DataLoaderTest : public test::SeededTest {
 protected:
  static std::shared_ptr<const Dataset> dataset() {
    auto d = std::make_shared<Dataset>();
    d->images = at::randint(0, 256, {37, 3, 6, 5}, at::kByte);
    d->labels = at::arange(37, at::kLong).remainder(4);
    d->class_names = {"a", "b", "c", "d"};
    return d;
  }
  static LoaderOptions options(int workers) {
    LoaderOptions o;
    o.batch_size = 8;
    o.seed = 42;
    o.num_workers = workers;
    o.transform.padding = 2;
    o.transform.flip_probability = 0.5;
    o.transform.mean = {0.5, 0.4, 0.3};
    o.transform.stddev = {0.2, 0.25, 0.3};
    return o;
  }
  static std::vector<Batch> pass(DataLoader& loader, int64_t epoch) {
    loader.set_epoch(epoch);
    std::vector<Batch> out;
    for (Batch& b : loader) out.push_back(b);
    return out;
  }
};

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].images, b[i].images)) << what << ", batch " << i;
    EXPECT_TRUE(at::equal(a[i].labels, b[i].labels)) << what << ", batch " << i;
    EXPECT_TRUE(at::equal(a[i].indices, b[i].indices)) << what << ", batch " << i;
    EXPECT_EQ(a[i].index, static_cast<int64_t>(i));
  }
}

TEST_F(DataLoaderTest, SameSeedSameBatchesWhateverTheWorkers) {
  auto d = dataset();
  DataLoader serial(d, options(0));
  std::vector<Batch> ref = pass(serial, 3);
  ASSERT_EQ(ref.size(), 5u);
  for (int workers : {1, 2, 3}) {
    for (int prefetch : {1, 4}) {
      LoaderOptions o = options(workers);
      o.prefetch_batches = prefetch;
      DataLoader loader(d, o);
      expect_same_batches(pass(loader, 3), ref,
                          std::to_string(workers) + " workers, prefetch " + std::to_string(prefetch));
      expect_same_batches(pass(loader, 3), ref, "second pass of the same epoch");
    }
  }
  // Each batch uses its own generator Rng::stream(seed, epoch, batch index).
  for (const Batch& b : ref) {
    Rng rng = Rng::stream(42, 3, static_cast<uint64_t>(b.index));
    EXPECT_TRUE(at::equal(b.images, transform_batch(d->images, b.indices, options(0).transform, rng)));
    EXPECT_TRUE(at::equal(serial.batch(3, b.index).images, b.images));
  }
}

TEST_F(DataLoaderTest, EveryEpochVisitsEverySampleOnceInANewOrder) {
  auto d = dataset();
  DataLoader loader(d, options(2));
  EXPECT_EQ(loader.num_batches(), 5);
  EXPECT_EQ(loader.num_samples(), 37);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch : {0, 1}) {
    std::vector<Batch> batches = pass(loader, epoch);
    ASSERT_EQ(batches.size(), 5u);
    std::vector<int64_t> order;
    for (const Batch& b : batches) {
      EXPECT_EQ(b.epoch, epoch);
      EXPECT_EQ(b.images.sizes(), at::IntArrayRef({b.index < 4 ? 8 : 5, 3, 6, 5}));
      EXPECT_EQ(b.images.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(b.labels, d->labels.index_select(0, b.indices)));
      for (int64_t i = 0; i < b.indices.numel(); ++i) order.push_back(b.indices[i].item<int64_t>());
    }
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(37);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << epoch;
    EXPECT_EQ(order, loader.permutation(epoch));
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  // Same sample, different epochs: different augmentation streams give different crops/flips.
  int differing = 0;
  for (int64_t b = 0; b < 5; ++b) {
    Rng e0 = Rng::stream(42, 0, static_cast<uint64_t>(b)), e1 = Rng::stream(42, 1, static_cast<uint64_t>(b));
    at::Tensor idx = longs({0, 1, 2, 3});
    differing += !at::equal(transform_batch(d->images, idx, options(0).transform, e0),
                            transform_batch(d->images, idx, options(0).transform, e1));
  }
  EXPECT_EQ(differing, 5);
  // Unshuffled: dataset order.
  LoaderOptions o = options(1);
  o.shuffle = false;
  DataLoader ordered(d, o);
  std::vector<Batch> batches = pass(ordered, 7);
  EXPECT_TRUE(at::equal(batches[1].indices, at::arange(8, 16, at::kLong)));
}

TEST_F(DataLoaderTest, DropLastCounts) {
  LoaderOptions o = options(2);
  o.drop_last = true;
  DataLoader loader(dataset(), o);
  EXPECT_EQ(loader.num_batches(), 4);
  EXPECT_EQ(loader.num_samples(), 32);
  std::vector<Batch> batches = pass(loader, 0);
  ASSERT_EQ(batches.size(), 4u);
  std::set<int64_t> seen;
  for (const Batch& b : batches) {
    EXPECT_EQ(b.images.size(0), 8);
    for (int64_t i = 0; i < 8; ++i) seen.insert(b.indices[i].item<int64_t>());
  }
  EXPECT_EQ(seen.size(), 32u);
  o.batch_size = 40;
  EXPECT_EQ(DataLoader(dataset(), o).num_batches(), 0);
  o.drop_last = false;
  EXPECT_EQ(DataLoader(dataset(), o).num_batches(), 1);
}

TEST_F(DataLoaderTest, EpochsAdvanceAndPassesRestart) {
  DataLoader loader(dataset(), options(2));
  std::vector<int64_t> epochs;
  for (int k = 0; k < 2; ++k)
    for (Batch& b : loader) epochs.push_back(b.epoch);  // no set_epoch: 0, then 1
  EXPECT_EQ(epochs, (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1}));
  // Abandon a pass after two batches, then restart the same epoch from its first batch.
  loader.set_epoch(9);
  loader.start();
  ASSERT_TRUE(loader.next().has_value());
  ASSERT_TRUE(loader.next().has_value());
  loader.set_epoch(9);
  std::vector<Batch> again;
  for (Batch& b : loader) again.push_back(b);
  ASSERT_EQ(again.size(), 5u);
  EXPECT_EQ(again[0].index, 0);
  EXPECT_TRUE(at::equal(again[0].images, loader.batch(9, 0).images));
  EXPECT_FALSE(loader.next().has_value());  // the pass is over
  // Resuming an epoch at batch 3 gives batches 3 and 4, as a full pass would.
  loader.set_epoch(9);
  loader.start(3);
  std::optional<Batch> b3 = loader.next(), b4 = loader.next();
  ASSERT_TRUE(b3 && b4);
  EXPECT_EQ(b3->index, 3);
  EXPECT_TRUE(at::equal(b3->images, again[3].images));
  EXPECT_TRUE(at::equal(b4->indices, again[4].indices));
  EXPECT_FALSE(loader.next().has_value());
  expect_error([&] { loader.start(6); }, {"first batch 6 is outside [0, 5]"});
}

TEST_F(DataLoaderTest, RejectsBadOptions) {
  LoaderOptions o = options(1);
  o.batch_size = 0;
  expect_error([&] { DataLoader loader(dataset(), o); }, {"batch_size must be > 0"});
  o = options(1);
  o.transform.crop_height = 20;
  expect_error([&] { DataLoader loader(dataset(), o); }, {"crop 20x5"});
  o = options(1);
  o.transform.mean = {0.1, 0.2};
  expect_error([&] { DataLoader loader(dataset(), o); }, {"mean has 2 values for 3 channels"});
  Dataset bad;
  bad.images = at::zeros({2, 3, 4, 4}, at::kFloat);
  bad.labels = at::zeros({2}, at::kLong);
  expect_error([&] { DataLoader loader(bad, options(1)); }, {"images must be uint8"});
}

TEST_F(DataLoaderTest, PinnedMemoryOnCuda) {
  WHITTLE_REQUIRE_CUDA();
  LoaderOptions o = options(2);
  o.pin_memory = true;
  DataLoader loader(dataset(), o);
  for (Batch& b : loader) {
    EXPECT_TRUE(b.images.is_pinned());
    EXPECT_TRUE(b.labels.is_pinned());
    at::Tensor on_gpu = b.images.to(at::Device(at::kCUDA), at::kFloat, /*non_blocking=*/true);
    EXPECT_TRUE(at::equal(on_gpu.cpu(), b.images));
  }
}

}  // namespace
}  // namespace whittle::data
