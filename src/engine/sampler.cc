#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace gemma4rt {

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count, float& log_normaliser) {
  const float maximum = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (const float logit : logits) total += std::exp(static_cast<double>(logit - maximum));
  log_normaliser = maximum + static_cast<float>(std::log(total));
  // A min-heap of the best `count` so far: one pass over the vocabulary.
  const auto better = [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob > b.logprob; };
  std::vector<TokenLogprob> best;
  for (int i = 0; i < static_cast<int>(logits.size()) && count > 0; ++i) {
    const TokenLogprob candidate{i, logits[static_cast<size_t>(i)] - log_normaliser};
    if (static_cast<int>(best.size()) < count) {
      best.push_back(candidate);
      std::push_heap(best.begin(), best.end(), better);
    } else if (candidate.logprob > best.front().logprob) {
      std::pop_heap(best.begin(), best.end(), better);
      best.back() = candidate;
      std::push_heap(best.begin(), best.end(), better);
    }
  }
  std::sort(best.begin(), best.end(), [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob != b.logprob ? a.logprob > b.logprob : a.token < b.token;
  });
  return best;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), random_(options.seed) {}

int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.greedy()) return argmax(logits);

  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) candidates_.emplace_back(logits[i] / options_.temperature, static_cast<int32_t>(i));
  }
  if (candidates_.empty()) return argmax(logits);
  // Highest first; equal logits keep id order so results do not depend on the sort's stability.
  auto by_logit = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  size_t keep = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  const float maximum = candidates_.front().first;
  double total = 0.0;
  for (auto& [value, id] : candidates_) {
    value = std::exp(value - maximum);
    total += value;
  }
  // min-p: relative to the most likely token (whose weight is exp(0) = 1).
  size_t cut = candidates_.size();
  if (options_.min_p > 0.0f) {
    for (size_t i = 1; i < cut; ++i) {
      if (candidates_[i].first < options_.min_p) {
        cut = i;
        break;
      }
    }
  }
  // top-p: the smallest prefix whose probability reaches top_p.
  if (options_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < cut; ++i) {
      cumulative += candidates_[i].first / total;
      if (cumulative >= options_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  candidates_.resize(std::max<size_t>(cut, 1));
  double kept_total = 0.0;
  for (const auto& [weight, id] : candidates_) kept_total += weight;
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  double target = uniform(random_);
  for (const auto& [weight, id] : candidates_) {
    target -= weight;
    if (target <= 0.0) return id;
  }
  return candidates_.back().second;
}

}  // namespace gemma4rt
