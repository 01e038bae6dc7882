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

std::string json_problem(int id, std::string_view what) {
  if (id == 406) return "a number literal is beyond double range";
  if (what.starts_with("[json.exception.")) {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  const bool syntax = id >= 100 && id < 200;
  return (syntax ? "invalid JSON: " : "") + printable(what, 200);
}

}  // namespace cobalt
