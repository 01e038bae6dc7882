// Writing several outputs of one command (simulate's --json, --report, --dump) so that one that
// fails does not cost the others.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace cobalt::cli {

class OutputBatch {
 public:
  // Runs write(), which writes the output `option` names completely or not at all. An exception
  // it throws is kept for finish(); the next outputs are still tried.
  void write(const std::string& option, const std::function<void()>& write);

  // Throws the first kept error (its type and code: an I/O error stays one; another exception
  // becomes kInternal) with the outputs that also failed (each with its reason) and those that
  // were written appended to its message; returns when every output was written.
  void finish() const;

 private:
  std::vector<std::string> written_;
  std::vector<std::string> failed_;  // the options, in order
  std::exception_ptr first_error_;
};

}  // namespace cobalt::cli
