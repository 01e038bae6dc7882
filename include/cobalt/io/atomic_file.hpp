// Output files that are either written completely or not at all. The bytes go to a temporary file
// next to the target, are synced, and the temporary file is renamed over the target only when
// everything was written: a failure (full disk, size limit, exception) leaves an existing file as
// it was and no temporary file behind. A symlink at the target is followed (the file it points to
// is replaced, the link is kept); an existing target that is not a regular file (a FIFO, a device,
// a directory) is refused rather than replaced.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace cobalt::io {

// The path a write to `path` replaces: symlinks resolved. Throws cobalt::Error(kInvalidArgument)
// naming `context` when the target exists and is not a regular file, or a symlink cannot be
// resolved.
std::string resolve_output_path(const std::string& path, std::string_view context);

class AtomicFileWriter {
 public:
  // Creates the temporary file (mode 0644) next to resolve_output_path(path). Throws
  // cobalt::Error(kInvalidArgument) naming `context` when it cannot.
  AtomicFileWriter(const std::string& path, std::string_view context);
  ~AtomicFileWriter();  // removes the temporary file unless commit() succeeded
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }
  // Syncs, closes and renames over the target. Throws cobalt::Error(kInvalidArgument) on failure
  // (the target is then unchanged).
  void commit();

  const std::string& target() const { return target_; }

 private:
  std::string target_, tmp_path_, context_;
  int fd_ = -1;
  bool committed_ = false;
};

// write_file_atomically(path, text): one AtomicFileWriter, one write, commit.
void write_file_atomically(const std::string& path, std::string_view text,
                           std::string_view context);

}  // namespace cobalt::io
