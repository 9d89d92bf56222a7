// Errors are values with context: every failure the user can cause (a bad file, a bad flag, a bad
// request) is thrown as gemma4rt::Error whose message names the file, tensor or field involved.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace gemma4rt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace gemma4rt
