// The bitpacked kernels on CUDA tensors (kernels/cuda_ops.h): allocation on the input's device and
// the launches of kernels/kernels_cuda.cu on the current stream. The callers have checked shapes,
// dtypes and devices.

#include "kernels/cuda_ops.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/kernels_cuda.h"

namespace whittle::kernels::detail::cuda {

namespace {

void check_launch(int code, const char* who) {
  if (code != 0) throw Error(std::string(who) + ": CUDA kernel launch failed: " + kernels_cuda_error_string(code));
}

void* stream_of(const at::Tensor& t) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

uint64_t* words_of(at::Tensor& t) { return reinterpret_cast<uint64_t*>(t.data_ptr<int64_t>()); }
const uint64_t* words_of(const at::Tensor& t) { return reinterpret_cast<const uint64_t*>(t.data_ptr<int64_t>()); }

const float* floats_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

}  // namespace

at::Tensor pack_signs(const at::Tensor& x) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor src = x.to(at::kFloat).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  std::vector<int64_t> shape{N};
  if (x.dim() == 4) shape.insert(shape.end(), {x.size(2), x.size(3)});
  shape.push_back(words_for(C));
  at::Tensor out = at::empty(shape, x.options().dtype(at::kLong));
  check_launch(pack_signs_cuda(src.data_ptr<float>(), words_of(out), N, C, HW, stream_of(x)), "pack_signs");
  return out;
}

at::Tensor pack_bitplanes(const at::Tensor& codes, int64_t bits) {
  const c10::cuda::CUDAGuard guard(codes.device());
  const at::Tensor src = codes.to(at::kFloat).contiguous();
  const int64_t N = codes.size(0), C = codes.size(1), HW = codes.dim() == 4 ? codes.size(2) * codes.size(3) : 1;
  std::vector<int64_t> shape{bits, N};
  if (codes.dim() == 4) shape.insert(shape.end(), {codes.size(2), codes.size(3)});
  shape.push_back(words_for(C));
  at::Tensor out = at::empty(shape, codes.options().dtype(at::kLong));
  at::Tensor bad = at::zeros({1}, codes.options().dtype(at::kInt));
  check_launch(pack_bitplanes_cuda(src.data_ptr<float>(), words_of(out), bad.data_ptr<int>(), N, C, HW,
                                   static_cast<int>(bits), stream_of(codes)),
               "pack_bitplanes");
  if (bad.item<int>() != 0)
    throw Error("pack_bitplanes: every code must be an integer in [0, " + std::to_string(int64_t{1} << bits) +
                "), got values in [" + std::to_string(src.min().item<double>()) + ", " +
                std::to_string(src.max().item<double>()) + "]");
  return out;
}

at::Tensor max_pool2d_signs(const at::Tensor& packed, const SignPool2dOptions& o, int64_t Ho, int64_t Wo) {
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor in = packed.contiguous();
  const cuda_body::PoolShape s = cuda_body::pool_shape(in.sizes().data(), Ho, Wo, o);
  at::Tensor out = at::empty({s.N, Ho, Wo, s.Cw}, in.options());
  check_launch(max_pool2d_signs_cuda(words_of(in), words_of(out), s, stream_of(in)), "max_pool2d_signs");
  return out;
}

at::Tensor binary_conv(const at::Tensor& x, const PackedBinaryWeight& w, const cuda_body::ConvShape& s, Output kind,
                       const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& threshold,
                       const at::Tensor& direction) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out;
  BinaryOutputKind k = BinaryOutputKind::kDot;
  if (kind == Output::kSign) {
    out = at::empty({s.N, s.Ho, s.Wo, words_for(s.O)}, x.options().dtype(at::kLong));
    k = BinaryOutputKind::kSign;
  } else {
    out = at::empty({s.N, s.O, s.Ho, s.Wo}, x.options().dtype(kind == Output::kDot ? at::kInt : at::kFloat));
    if (kind == Output::kFloat) k = BinaryOutputKind::kFloat;
  }
  check_launch(binary_conv2d_cuda(words_of(x), words_of(w.words), s, k, floats_or_null(scale), floats_or_null(bias),
                                  floats_or_null(threshold), floats_or_null(direction), out.data_ptr(), stream_of(x)),
               "binary layer");
  return out;
}

unsigned set_grid_limit(unsigned max_blocks) { return set_cuda_grid_limit(max_blocks); }

at::Tensor bitplane_conv(const at::Tensor& planes, const PackedBitplaneWeight& w, const cuda_body::ConvShape& s,
                         const at::Tensor& scale, const at::Tensor& bias) {
  const c10::cuda::CUDAGuard guard(planes.device());
  cuda_body::BitplaneWeight bw;
  bw.count = static_cast<int>(w.planes.size());
  bw.offset = w.offset;
  for (int i = 0; i < bw.count; ++i) {
    bw.planes[i] = words_of(w.planes[static_cast<size_t>(i)].words);
    bw.coefficients[i] = w.coefficients[static_cast<size_t>(i)];
  }
  at::Tensor out = at::empty({s.N, s.O, s.Ho, s.Wo}, planes.options().dtype(at::kFloat));
  check_launch(bitplane_conv2d_cuda(words_of(planes), planes.size(0), bw, s, scale.data_ptr<float>(),
                                    bias.data_ptr<float>(), out.data_ptr<float>(), stream_of(planes)),
               "bit-plane layer");
  return out;
}

}  // namespace whittle::kernels::detail::cuda
