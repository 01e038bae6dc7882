#include "output_batch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <new>

#include "cobalt/core/error.hpp"

namespace cobalt::cli {

void OutputBatch::write(const std::string& option, const std::function<void()>& write) {
  try {
    write();
    written_.push_back(option);
  } catch (const std::exception& e) {  // cobalt::Error, and a filesystem_error or bad_alloc too
    if (!first_error_) {
      first_error_ = std::current_exception();
    } else {
      failed_.push_back(fmt::format("{} ({})", option, e.what()));
      return;
    }
    failed_.push_back(option);
  }
}

void OutputBatch::finish() const {
  if (!first_error_) return;
  std::string outcome;
  if (failed_.size() > 1) {
    outcome +=
        fmt::format("; also failed: {}", fmt::join(failed_.begin() + 1, failed_.end(), "; "));
  }
  if (!written_.empty()) outcome += fmt::format("; written: {}", fmt::join(written_, ", "));
  try {
    std::rethrow_exception(first_error_);
  } catch (const IoError& e) {
    throw IoError(e.what() + outcome, e.os_errno());
  } catch (const Error& e) {
    throw Error(e.code(), e.what() + outcome);
  } catch (const std::bad_alloc&) {
    throw;  // main's message for it needs no memory
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, e.what() + outcome);
  }
}

}  // namespace cobalt::cli
