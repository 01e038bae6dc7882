// Output files that are either written completely or not at all. The bytes go to a temporary file
// next to the target, are synced, and the temporary file is renamed over the target only when
// everything was written: a failure (full disk, size limit, exception) leaves an existing file as
// it was and no temporary file behind. A symlink at the target is followed (the file it points to
// is replaced, the link is kept) and a replaced file keeps its permission bits (a new one gets
// 0666 minus the umask). An existing FIFO or character device (/dev/null, a pipe, a terminal) and
// the file this process's stdout or stderr writes to (`--json /dev/stdout > out.txt`) are written
// in place, as any tool writes them, never replaced; so is an existing writable file in a directory
// that cannot hold the temporary file (not atomic then). Directories, block devices and sockets
// are refused, and so is an existing file this process may not write (a 0444 file: the rename
// would need only the directory's permission, so it would bypass the file's own).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace cobalt::io {

struct OutputTarget {
  std::string path;     // the file written (links resolved when it is replaced)
  bool direct = false;  // an existing FIFO or character device: written in place, not replaced
  int stream_fd = -1;   // 1 or 2 when the target is this process's stdout / stderr (direct)
};

// Where a write to `path` goes. Throws cobalt::Error(kInvalidArgument) naming `context` when the
// target is a directory, a block device or a socket, or a link cannot be resolved.
OutputTarget resolve_output_target(const std::string& path, std::string_view context);

class AtomicFileWriter {
 public:
  // Creates the temporary file next to the resolved target (or opens a FIFO / character device).
  // Throws cobalt::Error(kInvalidArgument) naming `context` when it cannot.
  AtomicFileWriter(const std::string& path, std::string_view context);
  ~AtomicFileWriter();  // removes the temporary file unless commit() succeeded
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }
  // Syncs, closes and renames over the target. Throws cobalt::Error(kInvalidArgument) on failure
  // (the target is then unchanged).
  void commit();

  const std::string& target() const { return target_.path; }

 private:
  OutputTarget target_;
  std::string tmp_path_, context_;
  int fd_ = -1;
  bool committed_ = false;
};

// write_file_atomically(path, text): one AtomicFileWriter, one write, commit.
void write_file_atomically(const std::string& path, std::string_view text,
                           std::string_view context);

}  // namespace cobalt::io
