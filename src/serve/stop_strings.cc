#include "serve/stop_strings.h"

#include <algorithm>

namespace gemma4rt::serve {

StopStringFilter::StopStringFilter(std::vector<std::string> stop_strings) : stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& stop) { return stop.empty(); });
}

StopStringFilter::Result StopStringFilter::push(std::string_view text) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  pending_.append(text);
  // The earliest complete match wins.
  size_t match = std::string::npos;
  for (const std::string& stop : stop_strings_) match = std::min(match, pending_.find(stop));
  if (match != std::string::npos) {
    result.text = pending_.substr(0, match);
    result.stopped = stopped_ = true;
    pending_.clear();
    return result;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t length = std::min(stop.size() - 1, pending_.size()); length > hold; --length) {
      if (std::string_view(pending_).substr(pending_.size() - length) == std::string_view(stop).substr(0, length)) {
        hold = length;
        break;
      }
    }
  }
  result.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return result;
}

std::string StopStringFilter::finish() {
  std::string rest;
  if (!stopped_) rest.swap(pending_);
  return rest;
}

}  // namespace gemma4rt::serve
