#pragma once
// Batch transforms for image classification: random crop with zero padding, random horizontal
// flip, and per-channel normalization (uint8 in, float out), seeded through data::Rng.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "data/rng.h"

namespace whittle::data {

/// Per-channel normalization as torchvision's ToTensor + Normalize:
/// out[n, c, y, x] = (images[n, c, y, x] / 255 − mean[c]) / stddev[c].
/// `images`: uint8 [N, C, H, W] or [C, H, W]. `mean` and `stddev` are in pixel/255 units and hold
/// C values, or 1 value for every channel, or none (mean 0, stddev 1: plain division by 255).
/// Returns float32 of the same shape. Throws whittle::Error for a non-uint8 input, a wrong number
/// of values, or a stddev ≤ 0.
at::Tensor normalize(const at::Tensor& images, const std::vector<double>& mean, const std::vector<double>& stddev);

/// Crops every image of `images` ([N, C, H, W], any dtype) after zero-padding it by `padding`
/// pixels on each side: out[n, c, y, x] = padded[n, c, top + y, left + x], shape [N, C, height,
/// width]. Throws whittle::Error when the window leaves the padded image.
at::Tensor pad_crop(const at::Tensor& images, int64_t padding, int64_t top, int64_t left, int64_t height,
                    int64_t width);

/// Random crop with zero padding (torchvision RandomCrop(size, padding)): for each sample n in
/// order, draws top = rng.uniform_int(H + 2·padding − height + 1), then left likewise over the
/// width, and returns pad_crop of that sample: [N, C, height, width], same dtype. Consumes exactly
/// 2·N draws. Throws whittle::Error when the crop is larger than the padded image.
at::Tensor random_crop(const at::Tensor& images, int64_t height, int64_t width, int64_t padding, Rng& rng);

/// Mirrors images left-right: out[..., x] = images[..., W − 1 − x].
at::Tensor horizontal_flip(const at::Tensor& images);

/// Flips each sample of [N, C, H, W] independently with probability p: for each n in order, flips
/// when rng.uniform() < p. Consumes exactly N draws.
at::Tensor random_horizontal_flip(const at::Tensor& images, double p, Rng& rng);

/// A batch transform pipeline, applied in this order: random crop (when `padding` > 0 or a crop
/// size is set), random horizontal flip (when flip_probability > 0), normalization (always; with
/// empty mean/stddev it divides by 255).
struct Transform {
  int64_t crop_height = 0;  ///< crop output height in pixels; 0 = the input height
  int64_t crop_width = 0;   ///< crop output width in pixels; 0 = the input width
  int64_t padding = 0;      ///< zero padding added on each side before cropping, pixels
  double flip_probability = 0.0;
  std::vector<double> mean;    ///< per channel, pixel/255 units; empty = 0
  std::vector<double> stddev;  ///< per channel, pixel/255 units; empty = 1

  /// Whether the crop stage runs (draws 2 numbers per sample).
  bool crops() const { return padding > 0 || crop_height > 0 || crop_width > 0; }
  /// Output height and width for inputs of height h and width w.
  int64_t out_height(int64_t h) const { return crop_height > 0 ? crop_height : h; }
  int64_t out_width(int64_t w) const { return crop_width > 0 ? crop_width : w; }
  /// Throws whittle::Error unless the transform fits images of C channels and size h×w (mean/
  /// stddev counts, stddev > 0, crop within the padded image, 0 ≤ flip_probability ≤ 1).
  void validate(int64_t channels, int64_t h, int64_t w) const;
};

/// Applies `transform` to the samples images[indices] in one fused pass.
/// `images`: uint8 [N, C, H, W] contiguous CPU; `indices`: int64 [B] (values in [0, N)).
/// Random draws, in order: the crop offsets of every sample (as random_crop), then the flip of
/// every sample (as random_horizontal_flip), so the result equals
/// normalize(random_horizontal_flip(random_crop(images[indices], …, rng), p, rng), mean, stddev).
/// Returns float32 [B, C, out_height, out_width]; writes into `out` instead when it is defined
/// (float32, contiguous, that shape, CPU or pinned). Throws whittle::Error on bad arguments.
at::Tensor transform_batch(const at::Tensor& images, const at::Tensor& indices, const Transform& transform, Rng& rng,
                           at::Tensor out = {});

/// transform_batch over every sample of `images`, in order.
at::Tensor apply_transform(const at::Tensor& images, const Transform& transform, Rng& rng);

}  // namespace whittle::data
