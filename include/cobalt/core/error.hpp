// Errors at the library boundary: an exception carrying a code and a one-line message that names
// the offending value and, where there is one, the valid range.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cobalt {

enum class ErrorCode {
  kInvalidArgument,     // the caller passed something malformed or out of range
  kFailedPrecondition,  // the inputs are well formed but the request cannot be met (e.g. budget too
                        // small)
  kInternal,            // a bug in Cobalt: an invariant that should hold did not
};

std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message);
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// A failed operating-system file operation (open, stat, map, read, write, sync, rename): an Error
// with code kInvalidArgument (as such failures always were) that callers can tell apart by its
// type, e.g. to report it as an I/O error. os_errno() is the errno value the operation failed
// with (ENOENT, EACCES, ...), or 0 when none applies; Python raises cobalt.IoError (an
// InvalidArgumentError and an OSError with that errno), as FileNotFoundError and PermissionError
// subclasses for ENOENT and EACCES / EPERM.
class IoError : public Error {
 public:
  explicit IoError(std::string message, int os_errno = 0)
      : Error(ErrorCode::kInvalidArgument, std::move(message)), os_errno_(os_errno) {}
  int os_errno() const { return os_errno_; }

 private:
  int os_errno_;
};

template <typename... Args>
[[noreturn]] void fail_io(fmt::format_string<Args...> format, Args&&... args) {
  throw IoError(fmt::format(format, std::forward<Args>(args)...));
}

// fail_io with the errno value the failed operation set.
template <typename... Args>
[[noreturn]] void fail_io_errno(int os_errno, fmt::format_string<Args...> format, Args&&... args) {
  throw IoError(fmt::format(format, std::forward<Args>(args)...), os_errno);
}

template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace cobalt

// COBALT_CHECK(cond, code, "fmt", args...): throws cobalt::Error(code, message) when cond is false.
#define COBALT_CHECK(cond, code, ...)                         \
  do {                                                        \
    if (!(cond)) [[unlikely]] {                               \
      ::cobalt::fail(::cobalt::ErrorCode::code, __VA_ARGS__); \
    }                                                         \
  } while (0)

// COBALT_CHECK_IO(cond, "fmt", args...): throws cobalt::IoError(message) when cond is false.
#define COBALT_CHECK_IO(cond, ...)    \
  do {                                \
    if (!(cond)) [[unlikely]] {       \
      ::cobalt::fail_io(__VA_ARGS__); \
    }                                 \
  } while (0)

// COBALT_CHECK_ERRNO(cond, "fmt", args...): as COBALT_CHECK_IO for a system call that sets errno
// when it fails (cond false): the IoError carries that errno, read before the message's arguments.
#define COBALT_CHECK_ERRNO(cond, ...)                            \
  do {                                                           \
    if (!(cond)) [[unlikely]] {                                  \
      const int cobalt_failed_errno = errno;                     \
      ::cobalt::fail_io_errno(cobalt_failed_errno, __VA_ARGS__); \
    }                                                            \
  } while (0)

// Shorthands for the two common cases.
#define COBALT_CHECK_ARG(cond, ...) COBALT_CHECK(cond, kInvalidArgument, __VA_ARGS__)
#define COBALT_CHECK_INTERNAL(cond, ...) COBALT_CHECK(cond, kInternal, __VA_ARGS__)
