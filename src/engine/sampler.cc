#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/argmax.h"
#include "core/error.h"

namespace gemma4rt {

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count, float log_normaliser) {
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
  return static_cast<int32_t>(argmax_of(logits.data(), static_cast<int64_t>(logits.size())));
}

namespace {

// The argmax of a row that has a value above -inf; a row of NaN (a broken forward pass) is an error.
int32_t checked_argmax(std::span<const float> logits) {
  const auto size = static_cast<int64_t>(logits.size());
  const int64_t best = chosen_or_none(logits.data(), size, argmax_of(logits.data(), size));
  if (best < 0) fail("{}", kNoFiniteLogitError);
  return static_cast<int32_t>(best);
}

}  // namespace

Sampler::Sampler(const SamplingOptions& options) : options_(options), random_(options.seed) {}

int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.greedy()) return checked_argmax(logits);

  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) candidates_.emplace_back(logits[i] / options_.temperature, static_cast<int32_t>(i));
  }
  if (candidates_.empty()) return checked_argmax(logits);  // +inf, or nothing to choose
  // Highest first; equal logits keep id order, so which tokens a cut keeps never depends on a sort's
  // stability. Only what a filter needs is ordered: sorting a 262,144-token vocabulary for every
  // sampled token cost more than a tenth of a decode step.
  auto by_logit = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  const bool top_k = options_.top_k > 0 && static_cast<size_t>(options_.top_k) < candidates_.size();
  if (top_k) {
    // A heap of k: most tokens are rejected by one comparison (faster than nth_element for small k).
    std::partial_sort(candidates_.begin(), candidates_.begin() + options_.top_k, candidates_.end(), by_logit);
    candidates_.resize(static_cast<size_t>(options_.top_k));
  }
  // The most likely token: by_logit's first (its "minimum").
  const auto [maximum, most_likely] = top_k ? candidates_.front() : *std::min_element(candidates_.begin(), candidates_.end(), by_logit);
  double total = 0.0;
  for (auto& [value, id] : candidates_) {
    value = std::exp(value - maximum);
    total += value;
  }
  // min-p: relative to the most likely token (whose weight is exp(0) = 1), which always stays.
  if (options_.min_p > 0.0f) {
    std::erase_if(candidates_, [&](const auto& candidate) { return candidate.first < options_.min_p && candidate.first != 1.0f; });
  }
  // top-p: the smallest most-likely-first prefix whose probability (of the top-k total) reaches top_p.
  // The nucleus is usually a few dozen tokens: sort a prefix, and a longer one only when it falls short.
  if (options_.top_p < 1.0f) {
    size_t cut = candidates_.size();
    for (size_t sorted = std::min<size_t>(64, candidates_.size());; sorted = std::min(candidates_.size(), sorted * 8)) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(sorted), candidates_.end(), by_logit);
      double cumulative = 0.0;
      size_t i = 0;
      for (; i < sorted; ++i) {
        cumulative += candidates_[i].first / total;
        if (cumulative >= options_.top_p) break;
      }
      if (i < sorted) {
        cut = i + 1;
        break;
      }
      if (sorted == candidates_.size()) break;
    }
    candidates_.resize(cut);
  }
  double kept_total = 0.0;
  for (const auto& [weight, id] : candidates_) kept_total += weight;
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  double target = uniform(random_);
  for (const auto& [weight, id] : candidates_) {
    target -= weight;
    if (target <= 0.0) return id;
  }
  return most_likely;  // rounding left a sliver of the draw past the last weight
}

}  // namespace gemma4rt
