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

// A JSON library error (nlohmann::json::exception's `id` and `what()`) for a message, without the
// library's "[json.exception.parse_error.101] " tag: "invalid JSON: ..." for a syntax error (ids
// 101-199), "a number literal is beyond double range" for one (id 406: valid JSON, and its digits
// would fill the message), the library's words otherwise (type and encoding errors).
std::string json_problem(int id, std::string_view what);

}  // namespace cobalt
