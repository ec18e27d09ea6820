#pragma once
// Image-folder datasets inside a tar archive (.tar, .tar.gz, .tgz), read without extracting:
// entries [<prefix>/]<split>/<class>/<image>.jpg|.jpeg|.png, as the CIFAR-10 JPEG archive ships.

#include <string>

#include "data/dataset.h"
#include "data/image_folder.h"

namespace whittle::data {

/// True when `path` names a tar archive by its extension (.tar, .tar.gz, .tgz).
bool is_image_archive(const std::string& path);

/// Reads split `split` of an image-folder archive: every regular-file entry whose path has the
/// component `split` followed by exactly a class folder and a file name ending in .jpg, .jpeg or
/// .png. Classes are sorted byte-wise by name and samples ordered by class, then file name, as
/// read_image_folder orders them. Images are decoded on options.num_threads threads (libarchive
/// reads the archive sequentially; decoding is parallel). Returns images uint8 [N, C, H, W].
/// Throws whittle::Error naming the archive (and the entry) when it cannot be read, holds no
/// images for `split` (listing the splits it has), or an image cannot be decoded or differs in
/// size from the first.
Dataset read_image_archive(const std::string& path, const std::string& split, const ImageFolderOptions& options = {});

}  // namespace whittle::data
