#include "data/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "data/io_util.h"
#include "core/file_util.h"
#include "core/error.h"

namespace whittle::data {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// ---- PNG through libpng's progressive-free row API, with errors returned, not thrown ----
// libpng reports errors by longjmp; the function holding setjmp (png_run) keeps only trivially
// destructible locals so that the jump skips no destructor.

struct PngJob {
  const uint8_t* data;
  size_t size;
  size_t pos;
  bool header_only;
  // header (out)
  uint32_t width;
  uint32_t height;
  int stored_channels;  // 1 gray, 3 colour
  // decode (in): output interleaved rows, channels 1 (gray source only) or 3
  int out_channels;
  uint8_t* out;
  char error[256];
};

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, sizeof job->error, "%s", msg ? msg : "libpng error");
  png_longjmp(png, 1);
}

void png_warning_fn(png_structp, png_const_charp) {}

void png_read_fn(png_structp png, png_bytep dst, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->size - job->pos) png_error(png, "truncated PNG data");
  std::memcpy(dst, job->data + job->pos, n);
  job->pos += n;
}

bool png_run(PngJob* job) {
  job->error[0] = '\0';
  job->pos = 0;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, &png_error_fn, &png_warning_fn);
  if (png == nullptr) {
    std::snprintf(job->error, sizeof job->error, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(job->error, sizeof job->error, "out of memory");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, job, &png_read_fn);
  png_set_user_limits(png, 1u << 16, 1u << 16);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  job->width = width;
  job->height = height;
  job->stored_channels = (color_type & PNG_COLOR_MASK_COLOR) ? 3 : 1;
  if (job->header_only) {
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
  }
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (job->out_channels == 3 && job->stored_channels == 1) png_set_gray_to_rgb(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (row_bytes != static_cast<size_t>(width) * static_cast<size_t>(job->out_channels)) {
    std::snprintf(job->error, sizeof job->error, "unsupported PNG layout (%zu bytes per row for width %u)", row_bytes,
                  static_cast<unsigned>(width));
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  for (int pass = 0; pass < passes; ++pass)
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, job->out + static_cast<size_t>(y) * row_bytes, nullptr);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// Interleaved HWC (3 channels) to planar CHW.
void deinterleave_rgb(const uint8_t* hwc, int64_t pixels, uint8_t* chw) {
  uint8_t* r = chw;
  uint8_t* g = chw + pixels;
  uint8_t* b = chw + 2 * pixels;
  for (int64_t i = 0; i < pixels; ++i) {
    r[i] = hwc[3 * i];
    g[i] = hwc[3 * i + 1];
    b[i] = hwc[3 * i + 2];
  }
}

std::string tj_message(void* tj) { return tjGetErrorStr2(static_cast<tjhandle>(tj)); }

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageDecoder::ImageDecoder() : tj_(tjInitDecompress()) {
  if (tj_ == nullptr) throw Error(std::string("cannot create a TurboJPEG decompressor: ") + tjGetErrorStr2(nullptr));
}

ImageDecoder::~ImageDecoder() {
  if (tj_ != nullptr) tjDestroy(static_cast<tjhandle>(tj_));
}

ImageHeader ImageDecoder::header(const uint8_t* data, size_t size, const std::string& name) {
  if (size == 0) throw Error(name + ": empty file (0 bytes), not an image");
  ImageHeader h;
  h.format = sniff_image_format(data, size);
  if (h.format == ImageFormat::kJpeg) {
    int w = 0, ht = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(static_cast<tjhandle>(tj_), data, static_cast<unsigned long>(size), &w, &ht, &subsamp,
                            &colorspace) != 0)
      throw Error(name + ": undecodable JPEG header (" + tj_message(tj_) + ")");
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
      throw Error(name + ": CMYK JPEG images are not supported (convert it to RGB)");
    h.width = w;
    h.height = ht;
    h.channels = colorspace == TJCS_GRAY ? 1 : 3;
  } else if (h.format == ImageFormat::kPng) {
    PngJob job{};
    job.data = data;
    job.size = size;
    job.header_only = true;
    if (!png_run(&job)) throw Error(name + ": undecodable PNG header (" + job.error + ")");
    h.width = job.width;
    h.height = job.height;
    h.channels = job.stored_channels;
  } else {
    throw Error(name + ": not a JPEG or PNG image (unrecognised leading bytes)");
  }
  if (h.width <= 0 || h.height <= 0) throw Error(name + ": image has no pixels");
  return h;
}

void ImageDecoder::decode(const uint8_t* data, size_t size, const ImageHeader& header, int64_t channels, uint8_t* out,
                          const std::string& name) {
  if (channels != 1 && channels != 3)
    throw Error(name + ": can decode to 1 (gray) or 3 (RGB) channels, not " + std::to_string(channels));
  const int64_t pixels = header.width * header.height;
  if (header.format == ImageFormat::kJpeg) {
    uint8_t* dst = out;
    if (channels == 3) {
      scratch_.resize(static_cast<size_t>(pixels * 3));
      dst = scratch_.data();
    }
    const int w = static_cast<int>(header.width);
    const int h = static_cast<int>(header.height);
    if (tjDecompress2(static_cast<tjhandle>(tj_), data, static_cast<unsigned long>(size), dst, w,
                      w * static_cast<int>(channels), h, channels == 3 ? TJPF_RGB : TJPF_GRAY, 0) != 0)
      throw Error(name + ": undecodable JPEG (" + tj_message(tj_) + ")");
    if (channels == 3) deinterleave_rgb(dst, pixels, out);
  } else if (header.format == ImageFormat::kPng) {
    PngJob job{};
    job.data = data;
    job.size = size;
    job.header_only = false;
    const bool to_gray = channels == 1 && header.channels == 3;
    job.out_channels = to_gray ? 3 : static_cast<int>(channels);
    uint8_t* dst = out;
    if (job.out_channels == 3) {
      scratch_.resize(static_cast<size_t>(pixels * 3));
      dst = scratch_.data();
    }
    job.out = dst;
    if (!png_run(&job)) throw Error(name + ": undecodable PNG (" + job.error + ")");
    if (job.width != static_cast<uint32_t>(header.width) || job.height != static_cast<uint32_t>(header.height))
      throw Error(name + ": PNG size changed between header and decode");
    if (to_gray) {
      for (int64_t i = 0; i < pixels; ++i) {
        const uint32_t r = dst[3 * i], g = dst[3 * i + 1], b = dst[3 * i + 2];
        out[i] = static_cast<uint8_t>((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
      }
    } else if (channels == 3) {
      deinterleave_rgb(dst, pixels, out);
    }
  } else {
    throw Error(name + ": not a JPEG or PNG image (unrecognised leading bytes)");
  }
}

at::Tensor ImageDecoder::decode(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& name) {
  ImageHeader h = header(bytes.data(), bytes.size(), name);
  const int64_t c = channels == 0 ? h.channels : channels;
  at::Tensor out = at::empty({c, h.height, h.width}, at::kByte);
  decode(bytes.data(), bytes.size(), h, c, out.data_ptr<uint8_t>(), name);
  return out;
}

at::Tensor read_image(const std::string& path, int64_t channels) {
  ImageDecoder decoder;
  return decoder.decode(detail::read_file(path), channels, path);
}

}  // namespace whittle::data
