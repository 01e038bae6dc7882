#include "cobalt/core/text.hpp"

#include <fmt/format.h>

namespace cobalt {

std::string printable(std::string_view text, size_t max_chars) {
  std::string out;
  for (const char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

}  // namespace cobalt
