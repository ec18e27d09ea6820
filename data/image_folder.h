#pragma once
// Image folders: root/<class>/<image>.jpg|.jpeg|.png, one subfolder per class (the layout of
// torchvision's ImageFolder).

#include <string>
#include <vector>

#include "data/dataset.h"

namespace whittle::data {

/// Options of read_image_folder.
struct ImageFolderOptions {
  /// Channels of the decoded images: 0 = as the first image stores them (1 gray, 3 colour);
  /// 1 converts every image to gray, 3 to RGB (see ImageDecoder for the conversions).
  int64_t channels = 0;
  /// Decoding threads; 0 = std::thread::hardware_concurrency().
  int num_threads = 0;
};

/// One image file of an image folder with its class index.
struct ImageFolderEntry {
  std::string path;
  int64_t label = 0;
};

/// Lists an image folder: the class names are the names of root's subfolders (hidden ones
/// skipped) sorted byte-wise; each class's files are those directly inside its folder whose names
/// end in .jpg, .jpeg or .png (any case, hidden files skipped), sorted byte-wise by name. Other files
/// are ignored. Throws whittle::Error naming `root` when it is not a folder or has no class folders.
std::vector<ImageFolderEntry> list_image_folder(const std::string& root, std::vector<std::string>& class_names);

/// Reads an image folder (see list_image_folder) into memory, decoding the images on
/// `num_threads` threads. Labels are class indices in the sorted class order; samples are in
/// class order, then file order. Returns images uint8 [N, C, H, W].
/// Throws whittle::Error when the folder holds no images, when a file cannot be read or decoded
/// (naming it), or when an image's size differs from the first image's (naming the odd file, its
/// size, and the first file): every image of a folder must share one size. When several files
/// are bad, the first one in sample order is reported.
Dataset read_image_folder(const std::string& root, const ImageFolderOptions& options = {});

}  // namespace whittle::data
