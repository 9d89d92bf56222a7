// The numeric flag checks of every subcommand (declared in tools/commands.h). CLI11's PositiveNumber and
// NonNegativeNumber answer a bad value with the whole range of a double; these name the bound.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/thread_pool.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

CLI::Validator bound_check(double least, const char* words, const char* help, double most = INFINITY) {
  return CLI::Validator(
      [least, most, words](std::string& text) -> std::string {
        double value = 0.0;
        size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        // inf and nan parse as numbers too; neither is a temperature, a count or a length.
        if (used == 0 || used != text.size() || !std::isfinite(value) || !(value >= least) || !(value <= most)) {
          return fmt::format("expected {}, got \"{}\"", words, text);
        }
        return "";
      },
      help);
}

}  // namespace

const CLI::Validator& at_least_one() {
  static const CLI::Validator check = bound_check(1.0, "a number of at least 1", ">= 1");
  return check;
}

const CLI::Validator& zero_or_more() {
  static const CLI::Validator check = bound_check(0.0, "a number of 0 or more", ">= 0");
  return check;
}

const CLI::Validator& seed_value() {
  // A whole number checked as one: through a double, 2^63 and above would pass and then saturate.
  static const CLI::Validator check(
      [](std::string& text) -> std::string {
        int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size() || value < -1) {
          return fmt::format("expected a whole number from -1 to {}, got \"{}\"", INT64_MAX, text);
        }
        return "";
      },
      "-1 to 2^63-1");
  return check;
}

const CLI::Validator& zero_to_one() {
  static const CLI::Validator check = bound_check(0.0, "a number from 0 to 1", "0 to 1", 1.0);
  return check;
}

const CLI::Validator& thread_count() {
  static const std::string range = fmt::format("0 to {}", kMaxThreads), words = "a number from " + range;
  static const CLI::Validator check = bound_check(0.0, words.c_str(), range.c_str(), kMaxThreads);
  return check;
}

}  // namespace gemma4rt::tools
