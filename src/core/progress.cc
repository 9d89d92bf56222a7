#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace gemma4rt {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(200);
constexpr int kBarWidth = 30;

std::string format_duration(double seconds) {
  if (seconds < 60) return fmt::format("{:.0f}s", seconds);
  const auto whole = static_cast<int64_t>(seconds);
  if (whole < 3600) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}h{:02}m", whole / 3600, (whole % 3600) / 60);
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (bytes >= 1'000'000'000ull) return fmt::format("{:.2f} GB", value / 1e9);
  if (bytes >= 1'000'000ull) return fmt::format("{:.1f} MB", value / 1e6);
  if (bytes >= 1'000ull) return fmt::format("{:.1f} kB", value / 1e3);
  return fmt::format("{} B", bytes);
}

ProgressBar::ProgressBar(std::string label, uint64_t total_bytes, std::FILE* stream)
    : label_(std::move(label)),
      total_(total_bytes),
      stream_(stream),
      interactive_(stream != nullptr && ::isatty(::fileno(stream)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - kRedrawInterval) {}

ProgressBar::~ProgressBar() {
  // Abandoned mid-way (an error): end the redrawn line so the error message starts on its own line.
  std::lock_guard lock(mutex_);
  if (!finished_ && interactive_ && last_width_ > 0) {
    std::fputc('\n', stream_);
    std::fflush(stream_);
  }
}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string ProgressBar::render_line(uint64_t done, double seconds, bool final) const {
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  const std::string speed = fmt::format("{:.0f} MB/s", rate / 1e6);
  if (final && !interactive_) {
    return fmt::format("{}: {} in {:.1f} s ({})", label_, format_bytes(done), seconds, speed);
  }
  const double fraction = total_ > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kBarWidth - filled), '.');
  std::string line = fmt::format("{} [{}] {} / {} {:3.0f}% {}", label_, bar, format_bytes(done), format_bytes(total_),
                                 fraction * 100.0, speed);
  if (final) {
    line += fmt::format(" in {}", format_duration(seconds));
  } else if (rate > 0 && done < total_) {
    line += fmt::format(" ETA {}", format_duration(static_cast<double>(total_ - done) / rate));
  }
  return line;
}

void ProgressBar::update(uint64_t done_bytes) {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  done_ = done_bytes;
  if (!interactive_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  std::string line = render_line(done_, std::chrono::duration<double>(now - start_).count(), false);
  const size_t width = line.size();
  if (width < last_width_) line.append(last_width_ - width, ' ');
  last_width_ = width;
  fmt::print(stream_, "\r{}", line);
  std::fflush(stream_);
}

void ProgressBar::finish() {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (stream_ == nullptr) return;
  std::string line = render_line(done_, elapsed_seconds(), true);
  if (interactive_) {
    if (line.size() < last_width_) line.append(last_width_ - line.size(), ' ');
    fmt::print(stream_, "\r{}\n", line);
  } else {
    fmt::print(stream_, "{}\n", line);
  }
  std::fflush(stream_);
}

}  // namespace gemma4rt
