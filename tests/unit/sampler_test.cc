// Sampler: greedy is argmax with the lowest id on ties; sampling respects top-k / top-p / min-p and is
// reproducible for a seed.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "engine/sampler.h"

namespace gemma4rt {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler sampler({});
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  const std::vector<float> logits = {0.1f, 0.3f, 3.0f, 0.2f};
  Sampler sampler({.temperature = 5.0f, .top_k = 1, .seed = 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.sample(logits), 2);
}

TEST(Sampler, TopPKeepsOnlyTheNucleus) {
  // Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps ids 0 and 1 only.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  Sampler sampler({.temperature = 1.0f, .top_p = 0.8f, .seed = 11});
  std::set<int> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sampler.sample(logits));
  EXPECT_EQ(seen, (std::set<int>{0, 1}));
}

TEST(Sampler, TopPNucleusLongerThanOneSortedPrefix) {
  // 1,000 equal logits: top_p 0.5 keeps exactly the 500 lowest ids (ties go to the lower id), more
  // than the first prefix the sampler sorts.
  const std::vector<float> logits(1000, 0.25f);
  Sampler sampler({.temperature = 0.7f, .top_p = 0.5f, .seed = 17});
  int lowest = 1000, highest = -1;
  for (int i = 0; i < 5000; ++i) {
    const int token = sampler.sample(logits);
    lowest = std::min(lowest, token);
    highest = std::max(highest, token);
  }
  EXPECT_EQ(lowest, 0);
  EXPECT_EQ(highest, 499);
}

TEST(Sampler, TopKRenormalisesTheKeptTokens) {
  // top_k 2 keeps ids 3 and 1 (p = 0.75 : 0.25 between them) out of five.
  const std::vector<float> logits = {-1.0f, 1.0f, -0.5f, 1.0f + std::log(3.0f), 0.0f};
  Sampler sampler({.temperature = 1.0f, .top_k = 2, .seed = 99});
  std::map<int, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits)];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(static_cast<double>(counts[3]) / draws, 0.75, 0.02);
  EXPECT_NEAR(static_cast<double>(counts[1]) / draws, 0.25, 0.02);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -2.0f};
  Sampler sampler({.temperature = 1.0f, .min_p = 0.5f, .seed = 5});
  std::set<int> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sampler.sample(logits));
  EXPECT_EQ(seen, (std::set<int>{0, 1}));
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  Sampler sampler({.temperature = 1.0f, .seed = 1234});
  int ones = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ones += sampler.sample(logits);
  EXPECT_NEAR(static_cast<double>(ones) / draws, 0.75, 0.02);
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  Sampler first({.temperature = 1.0f, .seed = 42});
  Sampler second({.temperature = 1.0f, .seed = 42});
  Sampler third({.temperature = 1.0f, .seed = 43});
  std::vector<int> a, b, c;
  for (int i = 0; i < 50; ++i) {
    a.push_back(first.sample(logits));
    b.push_back(second.sample(logits));
    c.push_back(third.sample(logits));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
}  // namespace gemma4rt
