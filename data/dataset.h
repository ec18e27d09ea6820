#pragma once
// Dataset: a labelled image set held in memory (uint8 images N×C×H×W, int64 labels, class names).

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace whittle::data {

/// A labelled image classification set in memory, the common form every reader returns.
/// - `images`: uint8 [N, C, H, W], contiguous, on the CPU; C is 1 (gray) or 3 (RGB, channel
///   order R, G, B); pixel values 0..255 as stored in the file.
/// - `labels`: int64 [N], class indices in [0, number of classes).
/// - `class_names`: the name of each class index (may be empty when the source has none).
struct Dataset {
  at::Tensor images;
  at::Tensor labels;
  std::vector<std::string> class_names;

  /// Number of samples N.
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
  /// Channels C, height H and width W of every image.
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }
  /// Number of classes: class_names.size() when names are given, else max(label) + 1 (0 if empty).
  int64_t num_classes() const;
  /// Samples per class index, length num_classes().
  std::vector<int64_t> class_counts() const;
  /// The samples at `indices` (int64 [K]), as a new dataset with the same class names.
  Dataset subset(const at::Tensor& indices) const;

  /// Throws whittle::Error ("<where>: ...") unless images are uint8 [N, C, H, W] contiguous CPU
  /// with C in {1, 3}, labels are int64 [N] on the CPU, every label is ≥ 0, and every label is
  /// below class_names.size() when names are given.
  void validate(const std::string& where) const;
};

}  // namespace whittle::data
