// Safetensors container: a read-only memory mapping of a file, a validating header parser, and a
// writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON (an object; optional "__metadata__"
// string map, then one entry per tensor {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the data section), then the data section starting at byte 8 + N.
//
// Everything here is hostile-input safe: every error throws cobalt::Error(kInvalidArgument) with a
// one-line message "CONTEXT: WHAT: problem", where CONTEXT is supplied by the caller (e.g. "trace
// F").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/core/text.hpp"

namespace cobalt::io {

enum class Dtype { kBool, kU8, kI8, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64 };

// Bytes per element (1, 2, 4 or 8).
size_t dtype_size(Dtype dtype);
// The safetensors spelling ("I32", "BF16", ...).
std::string_view dtype_name(Dtype dtype);
// Parses a safetensors dtype spelling; nullopt for unknown ones (F8 variants are not supported).
std::optional<Dtype> parse_dtype(std::string_view name);

// Printable, single-line, length-capped rendering of an untrusted string for error messages.
using cobalt::printable;
// A tensor shape for error messages: "[2, 8, 4]"; a shape of more than 8 dimensions (a header may
// declare millions) is cut: "[1, 1, 1, 1, 1, 1, 1, 1, ... (20000000 dimensions)]".
std::string shape_text(std::span<const int64_t> shape);

// Read-only, private memory mapping of a whole regular file. Movable, not copyable.
class MappedFile {
 public:
  MappedFile() = default;
  // Throws kInvalidArgument "CONTEXT: cannot open: REASON" when the file cannot be opened, is not a
  // regular file, or cannot be mapped. An empty file maps to an empty span.
  MappedFile(const std::string& path, std::string_view context);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  void reset() noexcept;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;  // product(shape), overflow-checked
  uint64_t begin = 0;        // byte offsets in the data section, end - begin = num_elements * size
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_begin = 0;                      // absolute file offset of the data section (8 + N)
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)
  bool has_metadata = false;
  std::vector<TensorInfo> tensors;  // in data order (sorted by begin offset)

  // The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
};

// Headers larger than this are rejected (as the reference implementation does).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the container structure of a whole file image: length prefix within the
// file, JSON object, "__metadata__" a string map, every tensor entry well formed (known dtype,
// non-negative integer shape whose byte size does not overflow, 0 <= begin <= end, end - begin ==
// byte size), data inside the file, no two tensors overlapping. Does not look at tensor contents.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file,
                                           std::string_view context);

// The bytes of `tensor` inside `file` (which parse_safetensors_header validated against `header`).
std::span<const std::byte> tensor_bytes(std::span<const std::byte> file,
                                        const SafetensorsHeader& header, const TensorInfo& tensor);

struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // product(shape) * dtype_size bytes, little-endian
};

// Writes a safetensors file: tensors laid out contiguously ordered by decreasing dtype size (then
// in the given order) so each starts aligned to its element size; the JSON header is padded with
// spaces so the data section starts on an 8-byte boundary. Writes to a temporary file in the same
// directory and renames it over `path`, so a failure never leaves a partial file. Throws
// kInvalidArgument on size mismatches, duplicate names and I/O errors.
void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorToWrite> tensors, std::string_view context);

}  // namespace cobalt::io
