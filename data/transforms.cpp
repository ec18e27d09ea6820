#include "data/transforms.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace whittle::data {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// Per-channel lookup tables: lut[c·256 + v] = (v / 255 − mean_c) / stddev_c, in float.
std::vector<float> normalize_lut(int64_t channels, const std::vector<double>& mean, const std::vector<double>& stddev,
                                 const char* where) {
  auto check_count = [&](const std::vector<double>& v, const char* what) {
    if (!v.empty() && v.size() != 1 && static_cast<int64_t>(v.size()) != channels)
      throw Error(std::string(where) + ": " + what + " has " + std::to_string(v.size()) + " values for " +
                  std::to_string(channels) + " channels (give " + std::to_string(channels) + ", 1 or none)");
  };
  check_count(mean, "mean");
  check_count(stddev, "stddev");
  std::vector<float> lut(static_cast<size_t>(channels * 256));
  for (int64_t c = 0; c < channels; ++c) {
    const double m = mean.empty() ? 0.0 : mean[mean.size() == 1 ? 0 : static_cast<size_t>(c)];
    const double s = stddev.empty() ? 1.0 : stddev[stddev.size() == 1 ? 0 : static_cast<size_t>(c)];
    if (!(s > 0.0)) throw Error(std::string(where) + ": stddev of channel " + std::to_string(c) + " must be > 0");
    for (int v = 0; v < 256; ++v) lut[static_cast<size_t>(c * 256 + v)] = static_cast<float>((v / 255.0 - m) / s);
  }
  return lut;
}

void check_nchw(const at::Tensor& images, const char* where) {
  if (!images.defined() || images.dim() != 4)
    throw Error(std::string(where) + ": images must be [N, C, H, W], got shape " +
                (images.defined() ? shape_of(images) : std::string("undefined")));
}

}  // namespace

at::Tensor normalize(const at::Tensor& images, const std::vector<double>& mean, const std::vector<double>& stddev) {
  if (!images.defined() || images.scalar_type() != at::kByte || (images.dim() != 4 && images.dim() != 3))
    throw Error("normalize: images must be uint8 [N, C, H, W] or [C, H, W]");
  at::Tensor x = images.dim() == 3 ? images.unsqueeze(0) : images;
  x = x.contiguous().cpu();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const std::vector<float> lut = normalize_lut(c, mean, stddev, "normalize");
  at::Tensor out = at::empty(x.sizes(), at::kFloat);
  const uint8_t* src = x.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* table = lut.data() + ch * 256;
      const int64_t base = (i * c + ch) * hw;
      for (int64_t k = 0; k < hw; ++k) dst[base + k] = table[src[base + k]];
    }
  return images.dim() == 3 ? out.squeeze(0) : out;
}

at::Tensor pad_crop(const at::Tensor& images, int64_t padding, int64_t top, int64_t left, int64_t height,
                    int64_t width) {
  check_nchw(images, "pad_crop");
  const int64_t ph = images.size(2) + 2 * padding, pw = images.size(3) + 2 * padding;
  if (padding < 0 || top < 0 || left < 0 || height <= 0 || width <= 0 || top + height > ph || left + width > pw)
    throw Error("pad_crop: window top " + std::to_string(top) + ", left " + std::to_string(left) + ", " +
                std::to_string(height) + "x" + std::to_string(width) + " (height x width) does not fit the " +
                std::to_string(ph) + "x" + std::to_string(pw) + " padded image (padding " + std::to_string(padding) +
                ")");
  at::Tensor padded = padding > 0 ? at::constant_pad_nd(images, {padding, padding, padding, padding}, 0) : images;
  return padded.narrow(2, top, height).narrow(3, left, width).contiguous();
}

at::Tensor random_crop(const at::Tensor& images, int64_t height, int64_t width, int64_t padding, Rng& rng) {
  check_nchw(images, "random_crop");
  const int64_t ph = images.size(2) + 2 * padding, pw = images.size(3) + 2 * padding;
  if (padding < 0 || height <= 0 || width <= 0 || height > ph || width > pw)
    throw Error("random_crop: crop " + std::to_string(height) + "x" + std::to_string(width) +
                " does not fit the padded image " + std::to_string(ph) + "x" + std::to_string(pw));
  std::vector<at::Tensor> parts;
  for (int64_t n = 0; n < images.size(0); ++n) {
    const auto top = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(ph - height + 1)));
    const auto left = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(pw - width + 1)));
    parts.push_back(pad_crop(images.narrow(0, n, 1), padding, top, left, height, width));
  }
  if (parts.empty()) return at::empty({0, images.size(1), height, width}, images.options());
  return at::cat(parts, 0);
}

at::Tensor horizontal_flip(const at::Tensor& images) {
  if (!images.defined() || images.dim() < 2) throw Error("horizontal_flip: images must have a width axis");
  return at::flip(images, {-1});
}

at::Tensor random_horizontal_flip(const at::Tensor& images, double p, Rng& rng) {
  check_nchw(images, "random_horizontal_flip");
  at::Tensor out = images.clone();
  for (int64_t n = 0; n < images.size(0); ++n)
    if (rng.uniform() < p) out[n] = at::flip(images[n], {-1});
  return out;
}

void Transform::validate(int64_t channels, int64_t h, int64_t w) const {
  normalize_lut(channels, mean, stddev, "transform");
  if (padding < 0) throw Error("transform: padding must be ≥ 0, got " + std::to_string(padding));
  if (crop_height < 0 || crop_width < 0) throw Error("transform: crop size must be ≥ 0");
  if (out_height(h) > h + 2 * padding || out_width(w) > w + 2 * padding)
    throw Error("transform: crop " + std::to_string(out_height(h)) + "x" + std::to_string(out_width(w)) +
                " is larger than the padded " + std::to_string(h + 2 * padding) + "x" +
                std::to_string(w + 2 * padding) + " images (height x width)");
  if (!(flip_probability >= 0.0 && flip_probability <= 1.0))
    throw Error("transform: flip_probability must be in [0, 1], got " + std::to_string(flip_probability));
}

at::Tensor transform_batch(const at::Tensor& images, const at::Tensor& indices, const Transform& transform, Rng& rng,
                           at::Tensor out) {
  check_nchw(images, "transform_batch");
  if (images.scalar_type() != at::kByte || !images.is_contiguous() || !images.device().is_cpu())
    throw Error("transform_batch: images must be a contiguous uint8 CPU tensor");
  if (!indices.defined() || indices.scalar_type() != at::kLong || indices.dim() != 1)
    throw Error("transform_batch: indices must be int64 [B]");
  const int64_t n_total = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  transform.validate(C, H, W);
  const at::Tensor idx = indices.contiguous().cpu();
  const int64_t B = idx.size(0);
  const int64_t oh = transform.out_height(H), ow = transform.out_width(W);
  if (out.defined()) {
    if (out.scalar_type() != at::kFloat || !out.is_contiguous() || !out.device().is_cpu() ||
        out.sizes() != at::IntArrayRef({B, C, oh, ow}))
      throw Error("transform_batch: out must be a contiguous float32 CPU tensor [" + std::to_string(B) + ", " +
                  std::to_string(C) + ", " + std::to_string(oh) + ", " + std::to_string(ow) + "], got " +
                  shape_of(out));
  } else {
    out = at::empty({B, C, oh, ow}, at::kFloat);
  }
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i)
    if (ip[i] < 0 || ip[i] >= n_total)
      throw Error("transform_batch: index " + std::to_string(ip[i]) + " is outside [0, " + std::to_string(n_total) + ")");

  // Draws: every sample's crop offsets first, then every sample's flip (see the header).
  const int64_t pad = transform.padding;
  std::vector<int64_t> tops(static_cast<size_t>(B), pad), lefts(static_cast<size_t>(B), pad);
  std::vector<uint8_t> flips(static_cast<size_t>(B), 0);
  if (transform.crops()) {
    const auto range_y = static_cast<uint64_t>(H + 2 * pad - oh + 1), range_x = static_cast<uint64_t>(W + 2 * pad - ow + 1);
    for (int64_t i = 0; i < B; ++i) {
      tops[static_cast<size_t>(i)] = static_cast<int64_t>(rng.uniform_int(range_y));
      lefts[static_cast<size_t>(i)] = static_cast<int64_t>(rng.uniform_int(range_x));
    }
  }
  if (transform.flip_probability > 0.0)
    for (int64_t i = 0; i < B; ++i) flips[static_cast<size_t>(i)] = rng.uniform() < transform.flip_probability;

  const std::vector<float> lut = normalize_lut(C, transform.mean, transform.stddev, "transform");
  const uint8_t* src_all = images.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < B; ++i) {
    const uint8_t* src = src_all + ip[i] * C * H * W;
    // Output pixel (y, x) reads the padded image at (top + y, left + x') where x' = x, or
    // ow − 1 − x when flipped; padded (py, px) is the source (py − pad, px − pad) or zero.
    const int64_t y0 = tops[static_cast<size_t>(i)] - pad, x0 = lefts[static_cast<size_t>(i)] - pad;
    const bool flip = flips[static_cast<size_t>(i)] != 0;
    // Source columns inside the image: output x' in [xa, xb).
    const int64_t xa = std::clamp<int64_t>(-x0, 0, ow), xb = std::clamp<int64_t>(W - x0, 0, ow);
    for (int64_t c = 0; c < C; ++c) {
      const float* table = lut.data() + c * 256;
      const float zero = table[0];
      const uint8_t* plane = src + c * H * W;
      for (int64_t y = 0; y < oh; ++y) {
        float* row = dst + ((i * C + c) * oh + y) * ow;
        const int64_t sy = y0 + y;
        if (sy < 0 || sy >= H || xa >= xb) {
          std::fill(row, row + ow, zero);
          continue;
        }
        const uint8_t* srow = plane + sy * W;
        if (!flip) {
          std::fill(row, row + xa, zero);
          for (int64_t x = xa; x < xb; ++x) row[x] = table[srow[x0 + x]];
          std::fill(row + xb, row + ow, zero);
        } else {
          // row[x] = cropped[ow − 1 − x]
          for (int64_t x = 0; x < ow; ++x) row[x] = zero;
          for (int64_t xp = xa; xp < xb; ++xp) row[ow - 1 - xp] = table[srow[x0 + xp]];
        }
      }
    }
  }
  return out;
}

at::Tensor apply_transform(const at::Tensor& images, const Transform& transform, Rng& rng) {
  check_nchw(images, "apply_transform");
  return transform_batch(images.contiguous(), at::arange(images.size(0), at::kLong), transform, rng);
}

}  // namespace whittle::data
