// Copying table files for snapshots.
#pragma once

#include <string>

#include "common/status.h"

namespace mtrains {

// Copies `src` to `dst` (created or truncated) and fsyncs it. Tries a reflink (FICLONE,
// instant on btrfs/xfs), else copy_file_range over the data extents only, so holes of a
// sparse table stay holes. Thread-safe.
Status CopyFileSparse(const std::string& src, const std::string& dst);

// fsyncs the directory holding `path`, making a create or rename in it durable.
Status SyncParentDir(const std::string& path);

}  // namespace mtrains
