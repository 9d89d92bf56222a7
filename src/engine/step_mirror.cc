#include "engine/step_mirror.h"

#include <cstdint>
#include <vector>

namespace gemma4rt {
namespace {

struct StepHeader {
  int32_t rows = 0;        // -1: stop
  int32_t logit_rows = 0;
};

}  // namespace

void broadcast_step(parallel::Communicator& communicator, std::span<const BatchRow> rows, std::span<const int> logit_rows) {
  StepHeader header{static_cast<int32_t>(rows.size()), static_cast<int32_t>(logit_rows.size())};
  communicator.broadcast(&header, sizeof(header), 0);
  communicator.broadcast(const_cast<BatchRow*>(rows.data()), rows.size_bytes(), 0);
  communicator.broadcast(const_cast<int*>(logit_rows.data()), logit_rows.size_bytes(), 0);
}

void broadcast_stop(parallel::Communicator& communicator) {
  StepHeader header{-1, 0};
  communicator.broadcast(&header, sizeof(header), 0);
}

void follow_steps(parallel::Communicator& communicator, Transformer& transformer) {
  std::vector<BatchRow> rows;
  std::vector<int> logit_rows;
  std::vector<float> logits;
  while (true) {
    StepHeader header;
    communicator.broadcast(&header, sizeof(header), 0);
    if (header.rows < 0) return;
    rows.resize(header.rows);
    logit_rows.resize(header.logit_rows);
    communicator.broadcast(rows.data(), rows.size() * sizeof(BatchRow), 0);
    communicator.broadcast(logit_rows.data(), logit_rows.size() * sizeof(int), 0);
    logits.resize(logit_rows.size() * static_cast<size_t>(transformer.config().vocab_size));
    transformer.forward(rows, logit_rows, logits.data());
  }
}

}  // namespace gemma4rt
