#include "data/dataset.h"

#include <sstream>

#include "core/error.h"

namespace whittle::data {

int64_t Dataset::num_classes() const {
  if (!class_names.empty()) return static_cast<int64_t>(class_names.size());
  if (!labels.defined() || labels.numel() == 0) return 0;
  return labels.max().item<int64_t>() + 1;
}

std::vector<int64_t> Dataset::class_counts() const {
  std::vector<int64_t> counts(static_cast<size_t>(num_classes()), 0);
  if (!labels.defined()) return counts;
  at::Tensor l = labels.contiguous();
  const int64_t* p = l.data_ptr<int64_t>();
  for (int64_t i = 0; i < l.numel(); ++i)
    if (p[i] >= 0 && p[i] < static_cast<int64_t>(counts.size())) ++counts[static_cast<size_t>(p[i])];
  return counts;
}

Dataset Dataset::subset(const at::Tensor& indices) const {
  Dataset out;
  at::Tensor idx = indices.to(at::kLong);
  out.images = images.index_select(0, idx).contiguous();
  out.labels = labels.index_select(0, idx).contiguous();
  out.class_names = class_names;
  return out;
}

void Dataset::validate(const std::string& where) const {
  auto fail = [&](const std::string& what) { throw Error(where + ": " + what); };
  if (!images.defined() || !labels.defined()) fail("dataset has no images or no labels");
  std::ostringstream shape;
  shape << images.sizes();
  if (images.scalar_type() != at::kByte) fail(std::string("images must be uint8, got ") + c10::toString(images.scalar_type()));
  if (images.dim() != 4) fail("images must be [N, C, H, W], got shape " + shape.str());
  if (images.size(1) != 1 && images.size(1) != 3)
    fail("images must have 1 (gray) or 3 (RGB) channels, got shape " + shape.str());
  if (!images.device().is_cpu() || !images.is_contiguous()) fail("images must be a contiguous CPU tensor");
  if (labels.scalar_type() != at::kLong || labels.dim() != 1 || !labels.device().is_cpu())
    fail("labels must be an int64 [N] CPU tensor");
  if (labels.size(0) != images.size(0))
    fail("holds " + std::to_string(images.size(0)) + " images but " + std::to_string(labels.size(0)) + " labels");
  if (labels.numel() == 0) return;
  at::Tensor l = labels.contiguous();
  const int64_t* p = l.data_ptr<int64_t>();
  const auto n_names = static_cast<int64_t>(class_names.size());
  for (int64_t i = 0; i < l.numel(); ++i) {
    if (p[i] < 0 || (n_names > 0 && p[i] >= n_names))
      fail("label " + std::to_string(p[i]) + " of sample " + std::to_string(i) + " is outside [0, " +
           (n_names > 0 ? std::to_string(n_names) : std::string("inf")) + ")");
  }
}

}  // namespace whittle::data
