// A scratch directory of this rank's own under /tmp (O_DIRECT needs a disk file system, so not $TMPDIR, which
// may be a tmpfs), removed with everything in it when the object goes away. The offload tests put their swap
// files there.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace zero3::testing {

class RankTempDir {
 public:
  RankTempDir() {
    std::string tmpl = "/tmp/zero3-offload-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path_ = tmpl;
  }
  ~RankTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  RankTempDir(const RankTempDir&) = delete;
  RankTempDir& operator=(const RankTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace zero3::testing
