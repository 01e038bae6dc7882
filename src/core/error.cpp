#include "cobalt/core/error.hpp"

namespace cobalt {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kFailedPrecondition:
      return "failed precondition";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, std::string message)
    : std::runtime_error(std::move(message)), code_(code) {}

}  // namespace cobalt
