#include "graph/zoo.h"

#include <functional>
#include <utility>

#include "core/error.h"
#include "graph/graph_builder.h"

namespace whittle {
namespace {

// conv → BN, the unit most models repeat; returns the BN output.
std::string conv_bn(GraphBuilder& b, const std::string& conv_name, const std::string& bn_name, const std::string& x,
                    int64_t out, int64_t kernel, int64_t stride, int64_t padding, int64_t groups = 1,
                    bool bias = false) {
  return b.batch_norm(bn_name, b.conv2d(conv_name, x, out, kernel, stride, padding, groups, bias));
}

// LeNet-5 (LeCun et al., 1998) with BN after every layer but the classifier; see zoo.h.
std::string lenet5(GraphBuilder& b, const std::string& x, int64_t classes) {
  std::string h = b.relu("relu1", conv_bn(b, "conv1", "bn1", x, 6, 5, 1, 2));
  h = b.max_pool2d("pool1", h, 2);
  h = b.relu("relu2", conv_bn(b, "conv2", "bn2", h, 16, 5, 1, 0));
  h = b.max_pool2d("pool2", h, 2);
  h = b.flatten("flatten", h);
  h = b.relu("relu3", b.batch_norm("bn3", b.linear("fc1", h, 120, /*bias=*/false)));
  h = b.relu("relu4", b.batch_norm("bn4", b.linear("fc2", h, 84, /*bias=*/false)));
  return b.linear("fc3", h, classes);
}

// VGG-Small (Zhang et al., 2018, LQ-Nets): 128C3-128C3-MP2-256C3-256C3-MP2-512C3-512C3-MP2-FC.
std::string vgg_small(GraphBuilder& b, const std::string& x, int64_t classes) {
  const int64_t widths[] = {128, 128, 256, 256, 512, 512};
  std::string h = x;
  for (int i = 0; i < 6; ++i) {
    const std::string k = std::to_string(i);
    h = b.relu("relu" + k, conv_bn(b, "conv" + k, "bn" + k, h, widths[i], 3, 1, 1));
    if (i % 2 == 1) h = b.max_pool2d("pool" + k, h, 2);
  }
  return b.linear("fc", b.flatten("flatten", h), classes);
}

// Network in Network (Lin et al., 2014) in micronet's CIFAR-10 form: conv (with bias)-BN-ReLU units
// at nn.Sequential indices 0-2, 4-6, 8-10; max pools at 3 and 7; global average pool at 11.
std::string nin(GraphBuilder& b, const std::string& x, int64_t classes) {
  struct Unit {
    int index;
    int64_t out, kernel, padding;
  };
  const Unit units[] = {{0, 192, 5, 2}, {1, 160, 1, 0}, {2, 96, 1, 0},  {4, 192, 5, 2},  {5, 192, 1, 0},
                        {6, 192, 1, 0}, {8, 192, 3, 1}, {9, 192, 1, 0}, {10, classes, 1, 0}};
  std::string h = x;
  for (const Unit& u : units) {
    const std::string p = "model." + std::to_string(u.index);
    h = b.relu(p + ".relu", conv_bn(b, p + ".conv", p + ".bn", h, u.out, u.kernel, 1, u.padding, 1, true));
    if (u.index == 2 || u.index == 6) h = b.max_pool2d("model." + std::to_string(u.index + 1), h, 3, 2, 1);
  }
  h = b.global_avg_pool("model.11", h);
  return b.flatten("flatten", h);
}

// NIN with grouped convolutions and channel shuffles (micronet's nin_gc); see zoo.h.
std::string nin_gc(GraphBuilder& b, const std::string& x, int64_t classes) {
  struct Unit {
    int index;
    int64_t out, kernel, padding, groups, shuffle;  // shuffle: groups of the shuffle before the conv, 0 none
  };
  const Unit units[] = {{0, 256, 5, 2, 1, 0},   {1, 256, 1, 0, 2, 0},    {2, 256, 1, 0, 2, 2},
                        {4, 512, 3, 1, 16, 2},  {5, 512, 1, 0, 4, 16},   {6, 512, 1, 0, 4, 4},
                        {8, 1024, 3, 1, 32, 4}, {9, 1024, 1, 0, 8, 32},  {10, classes, 1, 0, 1, 0}};
  std::string h = x;
  for (const Unit& u : units) {
    const std::string p = "model." + std::to_string(u.index);
    if (u.shuffle) h = b.channel_shuffle(p + ".shuffle", h, u.shuffle);
    h = b.relu(p + ".relu", conv_bn(b, p + ".conv", p + ".bn", h, u.out, u.kernel, 1, u.padding, u.groups, true));
    if (u.index == 2 || u.index == 6) h = b.max_pool2d("model." + std::to_string(u.index + 1), h, 2, 2, 0);
  }
  h = b.global_avg_pool("model.11", h);
  return b.flatten("flatten", h);
}

// CIFAR ResNet-(6n+2) (He et al., 2016, section 4.2) with option B projection shortcuts.
std::string cifar_resnet(GraphBuilder& b, const std::string& x, int64_t classes, int n) {
  std::string h = b.relu("relu", conv_bn(b, "conv1", "bn1", x, 16, 3, 1, 1));
  const int64_t widths[] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (int i = 0; i < n; ++i) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(i);
      const int64_t out = widths[stage];
      const int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      std::string y = b.relu(p + ".relu1", conv_bn(b, p + ".conv1", p + ".bn1", h, out, 3, stride, 1));
      y = conv_bn(b, p + ".conv2", p + ".bn2", y, out, 3, 1, 1);
      std::string shortcut = h;
      if (stride != 1 || b.shape(h)[1] != out)
        shortcut = conv_bn(b, p + ".shortcut.0", p + ".shortcut.1", h, out, 1, stride, 0);
      h = b.relu(p + ".relu2", b.add(p + ".add", y, shortcut));
    }
  }
  h = b.flatten("flatten", b.global_avg_pool("avgpool", h));
  return b.linear("linear", h, classes);
}

// MobileNetV2 (Sandler et al., 2018) adapted to 32×32 inputs; see zoo.h.
std::string mobilenet_v2(GraphBuilder& b, const std::string& x, int64_t classes) {
  struct Row {
    int64_t t, c, n, s;
  };
  const Row table[] = {{1, 16, 1, 1}, {6, 24, 2, 1}, {6, 32, 3, 2}, {6, 64, 4, 2},
                       {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  std::string h = b.relu6("relu1", conv_bn(b, "conv1", "bn1", x, 32, 3, 1, 1));
  int block = 0;
  for (const Row& r : table) {
    for (int64_t i = 0; i < r.n; ++i, ++block) {
      const std::string p = "layers." + std::to_string(block);
      const int64_t in = b.shape(h)[1];
      const int64_t hidden = in * r.t;
      const int64_t stride = i == 0 ? r.s : 1;
      std::string y = h;
      if (r.t != 1) y = b.relu6(p + ".relu1", conv_bn(b, p + ".conv1", p + ".bn1", y, hidden, 1, 1, 0));
      y = b.relu6(p + ".relu2", conv_bn(b, p + ".conv2", p + ".bn2", y, hidden, 3, stride, 1, hidden));
      y = conv_bn(b, p + ".conv3", p + ".bn3", y, r.c, 1, 1, 0);
      h = (stride == 1 && in == r.c) ? b.add(p + ".add", y, h) : y;
    }
  }
  h = b.relu6("relu2", conv_bn(b, "conv2", "bn2", h, 1280, 1, 1, 0));
  h = b.flatten("flatten", b.global_avg_pool("avgpool", h));
  return b.linear("linear", h, classes);
}

// One training-time RepVGG block (Ding et al., 2021) under prefix `p`.
std::string repvgg_block(GraphBuilder& b, const std::string& p, const std::string& x, int64_t out, int64_t stride) {
  const int64_t in = b.shape(x)[1];
  std::string dense = conv_bn(b, p + ".rbr_dense.conv", p + ".rbr_dense.bn", x, out, 3, stride, 1);
  std::string pointwise = conv_bn(b, p + ".rbr_1x1.conv", p + ".rbr_1x1.bn", x, out, 1, stride, 0);
  std::string sum = b.add(p + ".add1", dense, pointwise);
  if (in == out && stride == 1) sum = b.add(p + ".add2", sum, b.batch_norm(p + ".rbr_identity", x));
  return b.relu(p + ".relu", sum);
}

// RepVGG-A0 (Ding et al., 2021) with stage0 at stride 1 for 32×32 inputs; see zoo.h.
std::string repvgg_a0(GraphBuilder& b, const std::string& x, int64_t classes) {
  const int64_t widths[] = {48, 48, 96, 192, 1280};
  const int depths[] = {1, 2, 4, 14, 1};
  const int64_t strides[] = {1, 2, 2, 2, 2};
  std::string h = repvgg_block(b, "stage0", x, widths[0], strides[0]);
  for (int k = 1; k < 5; ++k)
    for (int i = 0; i < depths[k]; ++i)
      h = repvgg_block(b, "stage" + std::to_string(k) + "." + std::to_string(i), h, widths[k], i == 0 ? strides[k] : 1);
  h = b.flatten("flatten", b.global_avg_pool("gap", h));
  return b.linear("linear", h, classes);
}

using Builder = std::function<std::string(GraphBuilder&, const std::string&, int64_t)>;

struct Entry {
  const char* name;
  int64_t in_channels;  // default input channels
  int64_t size;         // default input height = width
  Builder build;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {"lenet5", 1, 28, lenet5},
      {"vgg_small", 3, 32, vgg_small},
      {"nin", 3, 32, nin},
      {"nin_gc", 3, 32, nin_gc},
      {"resnet20", 3, 32, [](GraphBuilder& b, const std::string& x, int64_t c) { return cifar_resnet(b, x, c, 3); }},
      {"resnet32", 3, 32, [](GraphBuilder& b, const std::string& x, int64_t c) { return cifar_resnet(b, x, c, 5); }},
      {"resnet56", 3, 32, [](GraphBuilder& b, const std::string& x, int64_t c) { return cifar_resnet(b, x, c, 9); }},
      {"mobilenet_v2", 3, 32, mobilenet_v2},
      {"repvgg_a0", 3, 32, repvgg_a0},
  };
  return entries;
}

}  // namespace

namespace {
const std::pair<const char*, WeightInit> kWeightInits[] = {{"torch", WeightInit::kTorch},
                                                           {"kaiming_normal", WeightInit::kKaimingNormal}};
}  // namespace

std::vector<std::string> weight_init_names() {
  std::vector<std::string> names;
  for (const auto& [n, init] : kWeightInits) names.emplace_back(n);
  return names;
}

WeightInit weight_init_from_name(const std::string& name) {
  std::string known;
  for (const auto& [n, init] : kWeightInits) {
    if (name == n) return init;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw Error("unknown weight_init '" + name + "'; known: " + known, ErrorKind::kUsage);
}

std::vector<std::string> zoo_models() {
  std::vector<std::string> names;
  for (const Entry& e : registry()) names.emplace_back(e.name);
  return names;
}

Graph build_model(const std::string& name, const ZooOptions& options) {
  const Entry* entry = nullptr;
  for (const Entry& e : registry())
    if (name == e.name) entry = &e;
  if (!entry) {
    std::string known;
    for (const std::string& n : zoo_models()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown zoo model '" + name + "'; known models: " + known, ErrorKind::kUsage);
  }
  const std::string where = "zoo model '" + name + "': ";
  if (options.num_classes < 1) throw Error(where + "num_classes must be >= 1, got " + std::to_string(options.num_classes), ErrorKind::kUsage);
  if (options.in_channels && *options.in_channels < 1)
    throw Error(where + "in_channels must be >= 1, got " + std::to_string(*options.in_channels), ErrorKind::kUsage);

  Shape shape = options.input_shape;
  if (shape.empty()) {
    shape = {1, options.in_channels.value_or(entry->in_channels), entry->size, entry->size};
  } else {
    bool ok = shape.size() == 4;
    for (int64_t d : shape) ok = ok && d > 0;
    if (!ok) throw Error(where + "input_shape must be [N, C, H, W] with positive sizes, got " + shape_str(shape), ErrorKind::kUsage);
    if (options.in_channels && *options.in_channels != shape[1])
      throw Error(where + "in_channels " + std::to_string(*options.in_channels) + " disagrees with input_shape " +
                      shape_str(shape),
                  ErrorKind::kUsage);
  }

  GraphBuilder b(options.seed, options.weight_init);
  const std::string x = b.input("input", shape);
  const std::string out = entry->build(b, x, options.num_classes);
  return b.finish({out});
}

}  // namespace whittle
