// Rendering untrusted text (names from the command line, file paths, trace metadata) inside
// error messages, which must stay one line and readable.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cobalt {

// `text` with every byte outside printable ASCII written as \xNN, cut after `max_chars` output
// characters with "..." appended: one line whatever the input (a newline or a terminal escape in
// an argument cannot break or colour the message).
std::string printable(std::string_view text, size_t max_chars = 80);

}  // namespace cobalt
