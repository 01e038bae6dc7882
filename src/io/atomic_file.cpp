#include "cobalt/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "cobalt/core/error.hpp"

namespace cobalt::io {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

std::string resolve_output_path(const std::string& path, std::string_view context) {
  COBALT_CHECK_ARG(!path.empty(), "{}: empty output path", context);
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path target = path;
  // Follow links (chains too, dangling ones to the path they name); the links themselves stay.
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, error)); ++hops) {
    COBALT_CHECK_ARG(hops < 40, "{}: {}: too many levels of symbolic links", context, path);
    const fs::path next = fs::read_symlink(target, error);
    COBALT_CHECK_ARG(!error, "{}: cannot read the link {}: {}", context, target.string(),
                     error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status status = fs::status(target, error);
  COBALT_CHECK_ARG(!fs::exists(status) || fs::is_regular_file(status),
                   "{}: {} exists and is not a regular file (not replaced; write to a file)",
                   context, path);
  return target.string();
}

AtomicFileWriter::AtomicFileWriter(const std::string& path, std::string_view context)
    : target_(resolve_output_path(path, context)), context_(context) {
  tmp_path_ = target_ + ".tmp-XXXXXX";
  fd_ = ::mkstemp(tmp_path_.data());
  COBALT_CHECK_ARG(fd_ >= 0, "{}: cannot create a temporary file next to {}: {}", context_, path,
                   errno_text(errno));
  ::fchmod(fd_, 0644);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
  COBALT_CHECK(fd_ >= 0 && !committed_, kFailedPrecondition, "{}: write after commit", context_);
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    COBALT_CHECK_ARG(written > 0, "{}: cannot write {}: {}", context_, target_,
                     errno_text(written < 0 ? errno : EIO));
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
}

void AtomicFileWriter::commit() {
  COBALT_CHECK(fd_ >= 0 && !committed_, kFailedPrecondition, "{}: committed twice", context_);
  COBALT_CHECK_ARG(::fsync(fd_) == 0, "{}: cannot sync {}: {}", context_, target_,
                   errno_text(errno));
  const int rc = ::close(fd_);  // close can report deferred write errors
  fd_ = -1;
  COBALT_CHECK_ARG(rc == 0, "{}: cannot close {}: {}", context_, target_, errno_text(errno));
  COBALT_CHECK_ARG(::rename(tmp_path_.c_str(), target_.c_str()) == 0, "{}: cannot replace {}: {}",
                   context_, target_, errno_text(errno));
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view text,
                           std::string_view context) {
  AtomicFileWriter writer(path, context);
  writer.write(text);
  writer.commit();
}

}  // namespace cobalt::io
