#include "cobalt/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "cobalt/core/error.hpp"

namespace cobalt::io {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// 1 or 2 when `path` is the file this process's stdout or stderr writes to (`--json /dev/stdout`
// with stdout redirected to a file), else -1: replacing that file would cut the stream off, and
// opening it anew would write at offset 0 over what the stream wrote.
int standard_stream_of(const std::string& path) {
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return -1;
  for (int fd : {1, 2}) {
    struct stat stream {};
    if (::fstat(fd, &stream) == 0 && stream.st_dev == target.st_dev &&
        stream.st_ino == target.st_ino) {
      return fd;
    }
  }
  return -1;
}

// A new file in `target`'s directory named .cobalt-<pid>-<n>.tmp (short whatever the target's
// name), created exclusively with `mode` (the umask applies, as for any new file); -1 with errno
// set when the directory does not allow it.
int create_temporary(const std::string& target, mode_t mode, std::string& tmp_path) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path dir = std::filesystem::path(target).parent_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name =
        ".cobalt-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".tmp";
    tmp_path = dir.empty() ? name : (dir / name).string();
    const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

}  // namespace

OutputTarget resolve_output_target(const std::string& path, std::string_view context) {
  COBALT_CHECK_ARG(!path.empty(), "{}: empty output path", context);
  // The kernel would read the path only up to it: another file than the one named.
  COBALT_CHECK_ARG(path.find('\0') == std::string::npos,
                   "{}: output path contains a NUL byte (at {})", context, path.find('\0'));
  namespace fs = std::filesystem;
  std::error_code error;
  // The kernel follows links (also /proc's, such as /dev/stdout -> /proc/self/fd/1 -> pipe).
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status)) {
    const int stream = standard_stream_of(path);
    if (stream >= 0 || fs::is_fifo(status) || fs::is_character_file(status)) {
      return {path, true, stream};
    }
    COBALT_CHECK_ARG(fs::is_regular_file(status), "{}: {} is {} (give a file name)", context, path,
                     fs::is_directory(status) ? "a directory" : "not a regular file");
    const fs::path real = fs::canonical(path, error);
    COBALT_CHECK_ARG(!error, "{}: cannot resolve {}: {}", context, path, error.message());
    return {real.string(), false};
  }
  // A new file, possibly through a dangling link (chains too): the link stays, the file it names
  // is created.
  fs::path target = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, error)); ++hops) {
    COBALT_CHECK_ARG(hops < 40, "{}: {}: too many levels of symbolic links", context, path);
    const fs::path next = fs::read_symlink(target, error);
    COBALT_CHECK_ARG(!error, "{}: cannot read the link {}: {}", context, target.string(),
                     error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return {target.string(), false};
}

AtomicFileWriter::AtomicFileWriter(const std::string& path, std::string_view context)
    : target_(resolve_output_target(path, context)), context_(context) {
  if (!target_.direct) {
    struct stat existing {};
    const bool exists = ::stat(target_.path.c_str(), &existing) == 0;
    // Renaming over a file needs only the directory's permission: a file whose own permissions
    // refuse writing is refused here, as a shell redirection would refuse it.
    if (exists && ::access(target_.path.c_str(), W_OK) != 0) {
      const int access_errno = errno;  // EACCES, or EROFS on a read-only mount
      if (access_errno == EROFS) {
        fail_io_errno(access_errno, "{}: {} is on a read-only file system (give another file)",
                      context_, path);
      }
      fail_io_errno(access_errno,
                    "{}: {} is not writable (its permissions protect it; change them or give "
                    "another file)",
                    context_, path);
    }
    fd_ = create_temporary(target_.path, exists ? (existing.st_mode & 07777) : 0666, tmp_path_);
    if (fd_ >= 0) {
      if (exists) ::fchmod(fd_, existing.st_mode & 07777);  // the replaced file's bits exactly
      return;
    }
    const int create_errno = errno;
    // Only a directory that does not let us create files (permissions, a read-only mount with a
    // writable bind-mounted file) falls back to overwriting an existing writable file in place,
    // as plain tools do - not atomically. Any other failure (no space, no inodes, too many open
    // files) would most likely fail the write too, after truncating the old file: refused.
    const bool permission =
        create_errno == EACCES || create_errno == EPERM || create_errno == EROFS;
    if (!(permission && exists && ::access(target_.path.c_str(), W_OK) == 0)) {
      fail_io_errno(create_errno, "{}: cannot create a temporary file next to {}: {}", context_,
                    path, errno_text(create_errno));
    }
    target_.direct = true;
    fd_ = ::open(target_.path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    COBALT_CHECK_ERRNO(fd_ >= 0, "{}: cannot open {}: {}", context_, path, errno_text(errno));
    return;
  }
  if (target_.stream_fd >= 0) {
    // Through the stream's own file description (its offset, O_APPEND), after what the process
    // already buffered for it.
    std::fflush(target_.stream_fd == 1 ? stdout : stderr);
    fd_ = ::dup(target_.stream_fd);
  } else {
    fd_ = ::open(target_.path.c_str(), O_WRONLY | O_CLOEXEC);
  }
  COBALT_CHECK_ERRNO(fd_ >= 0, "{}: cannot open {}: {}", context_, path, errno_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !target_.direct) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
  COBALT_CHECK(fd_ >= 0 && !committed_, kFailedPrecondition, "{}: write after commit", context_);
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int err = written < 0 ? errno : EIO;
      fail_io_errno(err, "{}: cannot write {}: {}", context_, target_.path, errno_text(err));
    }
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
}

void AtomicFileWriter::commit() {
  COBALT_CHECK(fd_ >= 0 && !committed_, kFailedPrecondition, "{}: committed twice", context_);
  if (!target_.direct) {
    COBALT_CHECK_ERRNO(::fsync(fd_) == 0, "{}: cannot sync {}: {}", context_, target_.path,
                       errno_text(errno));
  }
  const int rc = ::close(fd_);  // close can report deferred write errors
  fd_ = -1;
  COBALT_CHECK_ERRNO(rc == 0, "{}: cannot close {}: {}", context_, target_.path, errno_text(errno));
  if (!target_.direct) {
    COBALT_CHECK_ERRNO(::rename(tmp_path_.c_str(), target_.path.c_str()) == 0,
                       "{}: cannot replace {}: {}", context_, target_.path, errno_text(errno));
  }
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view text,
                           std::string_view context) {
  AtomicFileWriter writer(path, context);
  writer.write(text);
  writer.commit();
}

}  // namespace cobalt::io
