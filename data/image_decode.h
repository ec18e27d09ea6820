#pragma once
// JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) decoding to planar uint8 pixels.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace whittle::data {

/// The container format of an encoded image, recognised by its leading bytes.
enum class ImageFormat { kUnknown, kJpeg, kPng };

/// JPEG when the data starts FF D8 FF, PNG when it starts with the 8-byte PNG signature.
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

/// What an encoded image's header says: size in pixels and stored channels (1 for gray, 3 for
/// colour; a PNG alpha channel is not counted, it is dropped on decoding).
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels = 0;
};

/// A reusable JPEG/PNG decoder. Holds a TurboJPEG handle and scratch memory, so one decoder per
/// thread decodes many images without allocating; not thread-safe itself.
///
/// Decoding rules (RGB output equals PIL's `Image.open(f).convert("RGB")`, checked bit for bit
/// by tests/reference/data_hdf5_check.py):
/// - JPEG: libjpeg-turbo's accurate integer IDCT and smooth chroma upsampling (libjpeg's
///   defaults); any libjpeg warning (e.g. a truncated file) is an error; CMYK/YCCK JPEGs are
///   rejected.
/// - PNG: any bit depth and colour type; 16-bit samples keep their high byte (PIL clips 16-bit
///   gray to 255 instead), palette images are expanded, alpha and tRNS transparency are dropped
///   without compositing, gamma chunks are ignored (the stored sample values are returned).
/// - Colour to gray: ITU-R BT.601 luma (JPEG: the decoded Y plane; PNG:
///   (19595·R + 38470·G + 7471·B + 32768) >> 16). Gray to RGB: the value in all three channels.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  /// Parses the header of the encoded image data[0, size). `name` (usually the file path) is used
  /// in messages. Throws whittle::Error "<name>: ..." when the data is neither JPEG nor PNG or the
  /// header is corrupt.
  ImageHeader header(const uint8_t* data, size_t size, const std::string& name);

  /// Decodes the image into `out`, planar uint8 [channels, height, width] (channels 1 or 3, sizes
  /// from `header`, which must come from header() on the same data). Throws whittle::Error
  /// "<name>: ..." when the image cannot be decoded.
  void decode(const uint8_t* data, size_t size, const ImageHeader& header, int64_t channels, uint8_t* out,
              const std::string& name);

  /// Decodes to a new uint8 [C, H, W] tensor; channels 0 keeps the stored channels (1 or 3).
  at::Tensor decode(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& name);

 private:
  void* tj_ = nullptr;
  std::vector<uint8_t> scratch_;
};

/// Reads and decodes the image file at `path` to uint8 [C, H, W]; channels 0 keeps the stored
/// channels, 1 converts to gray, 3 to RGB. Throws whittle::Error naming `path`.
at::Tensor read_image(const std::string& path, int64_t channels = 0);

}  // namespace whittle::data
