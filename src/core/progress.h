// A byte-count progress bar for long jobs (writing or loading multi-GB checkpoints). On a terminal it
// redraws one line in place a few times per second; otherwise it stays quiet until finish(), which
// prints one plain summary line, so logs and captured output are not flooded with redraws.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace gemma4rt {

class ProgressBar {
 public:
  // `stream` defaults to stderr; whether it is a terminal decides between redraws and one final line.
  ProgressBar(std::string label, uint64_t total_bytes, std::FILE* stream = stderr);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Records `done_bytes` of total; cheap to call often (redraws are rate-limited).
  void update(uint64_t done_bytes);
  // Draws the final state and ends the line. Further calls do nothing.
  void finish();

  bool interactive() const { return interactive_; }
  double elapsed_seconds() const;

 private:
  std::string render_line(uint64_t done, double seconds, bool final) const;

  std::string label_;
  uint64_t total_;
  std::FILE* stream_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  uint64_t done_ = 0;
  bool finished_ = false;
  size_t last_width_ = 0;  // characters of the previous redraw, to blank leftovers of a longer line
  mutable std::mutex mutex_;
};

// "1.23 GB", "512.0 MB", "3.4 kB", "17 B" (decimal units, as disk sizes are usually quoted).
std::string format_bytes(uint64_t bytes);

}  // namespace gemma4rt
