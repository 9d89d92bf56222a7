// Stop strings matched on generated text across token boundaries: text that could still become the
// start of a stop string is held back; on a match, the text before it is released and generation stops.
// The stop string itself is never part of the output.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gemma4rt::serve {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stop_strings);

  struct Result {
    std::string text;      // safe to release now
    bool stopped = false;  // a stop string matched; nothing after it may be released
  };
  Result push(std::string_view text);
  std::string finish();    // releases what was held back (no stop string matched)

 private:
  std::vector<std::string> stop_strings_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace gemma4rt::serve
