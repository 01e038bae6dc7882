#include "cobalt/io/safetensors.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/io/atomic_file.hpp"

namespace cobalt::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

namespace {

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DtypeEntry, 13> kDtypes = {{
    {Dtype::kBool, "BOOL", 1},
    {Dtype::kU8, "U8", 1},
    {Dtype::kI8, "I8", 1},
    {Dtype::kU16, "U16", 2},
    {Dtype::kI16, "I16", 2},
    {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},
    {Dtype::kU32, "U32", 4},
    {Dtype::kI32, "I32", 4},
    {Dtype::kF32, "F32", 4},
    {Dtype::kU64, "U64", 8},
    {Dtype::kI64, "I64", 8},
    {Dtype::kF64, "F64", 8},
}};

const DtypeEntry& entry_of(Dtype dtype) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.dtype == dtype) return entry;
  }
  fail(ErrorCode::kInternal, "safetensors: unknown dtype enum {}", static_cast<int>(dtype));
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Reads a JSON value that must be a non-negative integer no larger than int64 max.
std::optional<uint64_t> json_to_u63(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return v;
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

// What a JSON library error says, for a message (core/text.hpp).
std::string json_problem(const nlohmann::json::exception& error) {
  return cobalt::json_problem(error.id, error.what());
}

// A first pass over the header text (nlohmann's SAX interface) that refuses what the DOM parse
// must not see: nesting deeper than any safetensors header has (a DOM of 100,000 levels overflows
// the stack when destroyed or printed) and a key twice in one object (the DOM would keep the
// last). Linear in the header; nlohmann's parser callback, used before, rescanned each parent
// object whenever a nested object closed, quadratic in the number of entries.
class HeaderPrecheck {
 public:
  using json = nlohmann::json;
  // A valid header nests 3 deep (root object, tensor entry, shape array).
  static constexpr int kMaxDepth = 16;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys_.emplace_back();
    return enter();
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return enter(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(json::string_t& key) {
    if (keys_.back().insert(key).second) return true;
    duplicate_ = key;
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& error) {
    error_ = json_problem(error);
    return false;
  }

  // Throws kInvalidArgument naming the first problem found.
  void check(bool parsed, std::string_view context) const {
    COBALT_CHECK_ARG(!too_deep_,
                     "{}: header: JSON nested more than {} levels deep (a safetensors header has "
                     "3: the header object, a tensor entry, its shape)",
                     context, kMaxDepth);
    COBALT_CHECK_ARG(!duplicate_, "{}: header: key {} appears twice in one JSON object", context,
                     printable(duplicate_.value_or("")));
    COBALT_CHECK_ARG(parsed && error_.empty(), "{}: header: {}", context,
                     error_.empty() ? "invalid JSON" : error_);
  }

 private:
  bool enter() {
    if (++depth_ <= kMaxDepth) return true;
    too_deep_ = true;
    return false;
  }

  int depth_ = 0;
  bool too_deep_ = false;
  std::vector<std::set<std::string>> keys_;  // per open object
  std::optional<std::string> duplicate_;
  std::string error_;
};

TensorInfo parse_tensor_entry(const std::string& name, const nlohmann::json& entry,
                              uint64_t data_size, std::string_view context) {
  const std::string shown = printable(name);
  COBALT_CHECK_ARG(entry.is_object(), "{}: tensor {}: entry is a JSON {}, expected an object",
                   context, shown, entry.type_name());
  for (const auto& item : entry.items()) {
    COBALT_CHECK_ARG(item.key() == "dtype" || item.key() == "shape" || item.key() == "data_offsets",
                     "{}: tensor {}: unknown field {} (valid: dtype, shape, data_offsets)", context,
                     shown, printable(item.key()));
  }
  TensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  COBALT_CHECK_ARG(dtype_it != entry.end() && dtype_it->is_string(),
                   "{}: tensor {}: missing or non-string dtype", context, shown);
  const auto dtype = parse_dtype(dtype_it->get_ref<const std::string&>());
  COBALT_CHECK_ARG(dtype.has_value(), "{}: tensor {}: unknown dtype {}", context, shown,
                   printable(dtype_it->get_ref<const std::string&>()));
  info.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  COBALT_CHECK_ARG(shape_it != entry.end() && shape_it->is_array(),
                   "{}: tensor {}: missing shape or shape is not an array", context, shown);
  uint64_t num_elements = 1;
  for (size_t dim_idx = 0; dim_idx < shape_it->size(); ++dim_idx) {
    const auto dim = json_to_u63((*shape_it)[dim_idx]);
    COBALT_CHECK_ARG(dim.has_value(),
                     "{}: tensor {}: shape[{}] = {} is not an integer in [0, 2^63)", context, shown,
                     dim_idx, printable((*shape_it)[dim_idx].dump()));
    info.shape.push_back(static_cast<int64_t>(*dim));
    const bool overflow = __builtin_mul_overflow(num_elements, *dim, &num_elements);
    COBALT_CHECK_ARG(
        !overflow && num_elements <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "{}: tensor {}: element count of shape {} overflows (valid range [0, 2^63))", context,
        shown, printable(shape_it->dump()));
  }
  info.num_elements = static_cast<int64_t>(num_elements);
  uint64_t num_bytes = 0;
  COBALT_CHECK_ARG(!__builtin_mul_overflow(num_elements, dtype_size(info.dtype), &num_bytes),
                   "{}: tensor {}: byte size of shape {} overflows", context, shown,
                   printable(shape_it->dump()));

  const auto offsets_it = entry.find("data_offsets");
  COBALT_CHECK_ARG(offsets_it != entry.end() && offsets_it->is_array() && offsets_it->size() == 2,
                   "{}: tensor {}: data_offsets must be an array [begin, end]", context, shown);
  const auto begin = json_to_u63((*offsets_it)[0]);
  const auto end = json_to_u63((*offsets_it)[1]);
  COBALT_CHECK_ARG(begin.has_value() && end.has_value(),
                   "{}: tensor {}: data_offsets {} are not non-negative integers", context, shown,
                   printable(offsets_it->dump()));
  COBALT_CHECK_ARG(*begin <= *end, "{}: tensor {}: data_offsets end {} < begin {}", context, shown,
                   *end, *begin);
  COBALT_CHECK_ARG(*end <= data_size,
                   "{}: tensor {}: data_offsets [{}, {}) out of range (valid range [0, {}], the "
                   "data section; file truncated?)",
                   context, shown, *begin, *end, data_size);
  COBALT_CHECK_ARG(*end - *begin == num_bytes,
                   "{}: tensor {}: data_offsets span {} bytes but shape {} of {} needs {} bytes",
                   context, shown, *end - *begin, shape_text(info.shape), dtype_name(info.dtype),
                   num_bytes);
  info.begin = *begin;
  info.end = *end;
  return info;
}

// Owns a file descriptor; closes it on destruction.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error (close can report deferred write errors).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

size_t dtype_size(Dtype dtype) { return entry_of(dtype).size; }

std::string_view dtype_name(Dtype dtype) { return entry_of(dtype).name; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::string shape_text(std::span<const int64_t> shape) {
  constexpr size_t kShown = 8;
  if (shape.size() <= kShown) return fmt::format("[{}]", fmt::join(shape, ", "));
  return fmt::format("[{}, ... ({} dimensions)]", fmt::join(shape.first(kShown), ", "),
                     shape.size());
}

// ---------------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(const std::string& path, std::string_view context) {
  COBALT_CHECK_ARG(path.find('\0') == std::string::npos, "{}: path contains a NUL byte (at {})",
                   context, path.find('\0'));
  // O_NONBLOCK so that opening a FIFO does not hang; it is then rejected as not a regular file.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  COBALT_CHECK_ERRNO(fd.get() >= 0, "{}: cannot open: {}", context, errno_text(errno));
  struct stat st {};
  COBALT_CHECK_ERRNO(::fstat(fd.get(), &st) == 0, "{}: cannot stat: {}", context,
                     errno_text(errno));
  COBALT_CHECK_ARG(S_ISREG(st.st_mode), "{}: cannot open: not a regular file", context);
  COBALT_CHECK_ARG(
      st.st_size >= 0 && static_cast<uint64_t>(st.st_size) <= std::numeric_limits<size_t>::max(),
      "{}: cannot open: file size {} not addressable", context, st.st_size);
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return;
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  COBALT_CHECK_ERRNO(mapping != MAP_FAILED, "{}: cannot map {} bytes: {}", context, size,
                     errno_text(errno));
  data_ = static_cast<const std::byte*>(mapping);
  size_ = size;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------------------------------------------
// Header parsing

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  for (const TensorInfo& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file,
                                           std::string_view context) {
  COBALT_CHECK_ARG(file.size() >= 8,
                   "{}: header: file is {} bytes, too short for the 8-byte header length (valid "
                   "range >= 8)",
                   context, file.size());
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), sizeof(header_len));
  COBALT_CHECK_ARG(file.size() >= 10,
                   "{}: header: file is {} bytes, too short for a header (header length {}; a "
                   "safetensors file holds the 8-byte length and a JSON header of >= 2 bytes)",
                   context, file.size(), header_len);
  const uint64_t max_len = std::min<uint64_t>(file.size() - 8, kMaxSafetensorsHeaderBytes);
  COBALT_CHECK_ARG(header_len >= 2 && header_len <= max_len,
                   "{}: header: header length {} out of range (valid range [2, {}] for a {}-byte "
                   "file)",
                   context, header_len, max_len, file.size());

  SafetensorsHeader header;
  header.data_begin = 8 + header_len;
  const uint64_t data_size = file.size() - header.data_begin;

  const auto* json_begin = reinterpret_cast<const char*>(file.data() + 8);
  const auto* json_end = json_begin + header_len;
  // nlohmann's reader stops at a NUL byte, which would leave whatever follows unread.
  if (const void* nul = std::memchr(json_begin, 0, header_len)) {
    fail(ErrorCode::kInvalidArgument,
         "{}: header: NUL byte at offset {} of the {}-byte JSON header (valid: UTF-8 JSON, padded "
         "with spaces)",
         context, static_cast<const char*>(nul) - json_begin, header_len);
  }
  // nlohmann skips a UTF-8 byte order mark; safetensors readers do not (the header starts with
  // '{').
  COBALT_CHECK_ARG(
      !(header_len >= 3 && static_cast<unsigned char>(json_begin[0]) == 0xEF &&
        static_cast<unsigned char>(json_begin[1]) == 0xBB &&
        static_cast<unsigned char>(json_begin[2]) == 0xBF),
      "{}: header: starts with a UTF-8 byte order mark (valid: the JSON object itself)", context);
  HeaderPrecheck precheck;
  bool prechecked = false;
  try {
    prechecked = nlohmann::json::sax_parse(json_begin, json_end, &precheck);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "{}: header: {}", context, json_problem(e));
  }
  precheck.check(prechecked, context);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_begin, json_end);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "{}: header: {}", context, json_problem(e));
  }
  COBALT_CHECK_ARG(json.is_object(), "{}: header: JSON header is {}, expected an object", context,
                   json.type_name());

  try {
    for (const auto& item : json.items()) {
      const std::string& name = item.key();
      if (name == "__metadata__") {
        COBALT_CHECK_ARG(item.value().is_object(),
                         "{}: __metadata__: is a JSON {}, expected a string map", context,
                         item.value().type_name());
        for (const auto& meta : item.value().items()) {
          COBALT_CHECK_ARG(meta.value().is_string(),
                           "{}: __metadata__: value of {} is a JSON {}, expected a string", context,
                           printable(meta.key()), meta.value().type_name());
          header.metadata.emplace(meta.key(), meta.value().get<std::string>());
        }
        header.has_metadata = true;
        continue;
      }
      header.tensors.push_back(parse_tensor_entry(name, item.value(), data_size, context));
    }
  } catch (const nlohmann::json::exception& e) {
    // Not expected (every access is type-checked first), but never let a JSON error escape raw.
    fail(ErrorCode::kInvalidArgument, "{}: header: {}", context, json_problem(e));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  // Non-empty tensors must not share bytes (empty ones occupy no bytes).
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& tensor : header.tensors) {
    if (tensor.begin == tensor.end) continue;
    if (previous != nullptr) {
      COBALT_CHECK_ARG(tensor.begin >= previous->end,
                       "{}: tensor {}: data_offsets [{}, {}) overlap tensor {} at [{}, {})",
                       context, printable(tensor.name), tensor.begin, tensor.end,
                       printable(previous->name), previous->begin, previous->end);
    }
    previous = &tensor;
  }
  // The safetensors rule: the data buffer is entirely indexed, without holes (no bytes that no
  // tensor owns, which would allow polyglot files).
  uint64_t covered = 0;
  for (const TensorInfo& tensor : header.tensors) {
    // Empty tensors too sit at the running offset (not inside another tensor's bytes).
    COBALT_CHECK_ARG(tensor.begin >= covered,
                     "{}: tensor {}: data_offsets [{}, {}) lie inside another tensor's bytes "
                     "(which end at {})",
                     context, printable(tensor.name), tensor.begin, tensor.end, covered);
    COBALT_CHECK_ARG(tensor.begin == covered,
                     "{}: data bytes [{}, {}) belong to no tensor (tensor {} starts at {}; the "
                     "buffer must be entirely indexed)",
                     context, covered, tensor.begin, printable(tensor.name), tensor.begin);
    covered = tensor.end;
  }
  COBALT_CHECK_ARG(covered == data_size,
                   "{}: {} bytes after the last tensor belong to no tensor (data ends at {}, the "
                   "file has {} data bytes)",
                   context, data_size - covered, covered, data_size);
  return header;
}

std::span<const std::byte> tensor_bytes(std::span<const std::byte> file,
                                        const SafetensorsHeader& header, const TensorInfo& tensor) {
  COBALT_CHECK_INTERNAL(tensor.begin <= tensor.end && header.data_begin <= file.size() &&
                            tensor.end <= file.size() - header.data_begin,
                        "safetensors: tensor {} [{}, {}) outside a {}-byte file",
                        printable(tensor.name), tensor.begin, tensor.end, file.size());
  return file.subspan(static_cast<size_t>(header.data_begin + tensor.begin),
                      static_cast<size_t>(tensor.end - tensor.begin));
}

// ---------------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorToWrite> tensors, std::string_view context) {
  std::vector<const TensorToWrite*> order;
  std::set<std::string_view> names;
  for (const TensorToWrite& tensor : tensors) {
    COBALT_CHECK_ARG(tensor.name != "__metadata__", "{}: __metadata__: reserved name, not a tensor",
                     context);
    COBALT_CHECK_ARG(names.insert(tensor.name).second, "{}: tensor {}: written twice", context,
                     printable(tensor.name));
    uint64_t num_bytes = dtype_size(tensor.dtype);
    for (const int64_t dim : tensor.shape) {
      COBALT_CHECK_ARG(dim >= 0, "{}: tensor {}: negative dimension {}", context,
                       printable(tensor.name), dim);
      COBALT_CHECK_ARG(!__builtin_mul_overflow(num_bytes, static_cast<uint64_t>(dim), &num_bytes),
                       "{}: tensor {}: byte size overflows", context, printable(tensor.name));
    }
    COBALT_CHECK_ARG(num_bytes == tensor.data.size(),
                     "{}: tensor {}: {} data bytes for shape of {} bytes", context,
                     printable(tensor.name), tensor.data.size(), num_bytes);
    order.push_back(&tensor);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });

  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    json["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorToWrite* tensor : order) {
    json[tensor->name] = {{"dtype", dtype_name(tensor->dtype)},
                          {"shape", tensor->shape},
                          {"data_offsets", {offset, offset + tensor->data.size()}}};
    offset += tensor->data.size();
  }
  std::string header_text;
  try {
    header_text = json.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "{}: header: cannot encode: {}", context, json_problem(e));
  }
  while ((8 + header_text.size()) % 8 != 0) header_text += ' ';
  const uint64_t header_len = header_text.size();
  // Readers (this one and the reference implementation) refuse larger headers.
  COBALT_CHECK_ARG(header_len <= kMaxSafetensorsHeaderBytes,
                   "{}: header: {} bytes (metadata and tensor entries) out of range [2, {}]; "
                   "keep the metadata smaller",
                   context, header_len, kMaxSafetensorsHeaderBytes);

  AtomicFileWriter writer(path, context);
  std::array<std::byte, 8> length_bytes{};
  std::memcpy(length_bytes.data(), &header_len, sizeof(header_len));
  writer.write(length_bytes);
  writer.write(header_text);
  for (const TensorToWrite* tensor : order) writer.write(tensor->data);
  writer.commit();
}

}  // namespace cobalt::io
