#include "parallel/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace gemma4rt::parallel {

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }

  void all_reduce_sum(float* data, size_t count) override {
    const auto start = std::chrono::steady_clock::now();
    // Publish, wait for everyone, sum in rank order into a private copy, and wait again before anyone
    // overwrites its buffer.
    scratch_.resize(count);
    group_.sources_[rank_] = data;
    group_.barrier_.arrive_and_wait();
    std::memcpy(scratch_.data(), group_.sources_[0], count * sizeof(float));
    for (int other = 1; other < group_.size_; ++other) {
      const float* source = group_.sources_[other];
      for (size_t i = 0; i < count; ++i) scratch_[i] += source[i];
    }
    group_.barrier_.arrive_and_wait();
    std::memcpy(data, scratch_.data(), count * sizeof(float));
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void all_gather(const float* send, std::span<const size_t> counts, float* out) override {
    const auto start = std::chrono::steady_clock::now();
    group_.sources_[rank_] = send;
    group_.barrier_.arrive_and_wait();
    size_t offset = 0;
    for (int other = 0; other < group_.size_; ++other) {
      std::memcpy(out + offset, group_.sources_[other], counts[other] * sizeof(float));
      offset += counts[other];
    }
    group_.barrier_.arrive_and_wait();
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (rank_ == root) group_.broadcast_sources_[0] = data;
    group_.barrier_.arrive_and_wait();
    if (rank_ != root) std::memcpy(data, group_.broadcast_sources_[0], bytes);
    group_.barrier_.arrive_and_wait();
  }

 private:
  InProcessGroup& group_;
  int rank_;
  std::vector<float> scratch_;
};

InProcessGroup::InProcessGroup(int size) : size_(size), barrier_(size > 0 ? size : 1), sources_(size > 0 ? size : 1, nullptr), broadcast_sources_(1, nullptr) {
  if (size < 1) fail("a tensor-parallel group needs at least one rank, got {}", size);
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  if (rank < 0 || rank >= size_) fail("rank {} is outside the group of {}", rank, size_);
  return std::make_unique<InProcessCommunicator>(*this, rank);
}

namespace {
int environment_integer(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return fallback;
}
}  // namespace

int launched_rank() { return environment_integer({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0); }
int launched_size() { return environment_integer({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1); }
int launched_local_size() {
  return std::max(1, environment_integer({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, 1));
}

}  // namespace gemma4rt::parallel
