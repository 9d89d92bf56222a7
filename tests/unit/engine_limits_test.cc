// What the engine refuses before it allocates: contexts beyond the model's trained positions, and KV
// caches the machine cannot hold (instead of allocating until the OOM killer ends the process).
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/transformer.h"
#include "model/weights.h"

namespace gemma4rt {
namespace {

std::string error_of(const Model& model, const EngineOptions& options) {
  try {
    Transformer transformer(model, options);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(EngineLimits, ContextBeyondTrainedPositions) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  EngineOptions options;
  options.context_tokens = model->config().max_position_embeddings + 1;
  const std::string error = error_of(*model, options);
  EXPECT_NE(error.find("exceeds what the model was trained for"), std::string::npos) << error;
  EXPECT_NE(error.find(std::to_string(model->config().max_position_embeddings)), std::string::npos) << error;
}

TEST(EngineLimits, KvCacheBeyondAvailableMemory) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  EngineOptions options;
  options.context_tokens = model->config().max_position_embeddings;  // 131072 positions
  options.sequences = 1 << 20;                                        // for a million sequences: terabytes
  const std::string error = error_of(*model, options);
  EXPECT_NE(error.find("KV cache and scratch"), std::string::npos) << error;
  EXPECT_NE(error.find("available"), std::string::npos) << error;
}

}  // namespace
}  // namespace gemma4rt
