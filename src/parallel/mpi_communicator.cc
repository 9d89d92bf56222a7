// The MPI communicator. Built only where an MPI implementation was found (GEMMA4RT_HAVE_MPI);
// elsewhere make_mpi_communicator returns nullptr and multi-process runs are refused clearly.
#include <chrono>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

#ifdef GEMMA4RT_HAVE_MPI
#include <mpi.h>
#endif

namespace gemma4rt::parallel {

#ifdef GEMMA4RT_HAVE_MPI
namespace {

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t count) override {
    const auto start = std::chrono::steady_clock::now();
    // Gather every rank's part and add in rank order, so all ranks hold bit-identical sums (MPI_Allreduce
    // does not promise one reduction order everywhere).
    gathered_.resize(count * size_);
    MPI_Allgather(data, static_cast<int>(count), MPI_FLOAT, gathered_.data(), static_cast<int>(count), MPI_FLOAT, MPI_COMM_WORLD);
    for (size_t i = 0; i < count; ++i) {
      float sum = gathered_[i];
      for (int other = 1; other < size_; ++other) sum += gathered_[other * count + i];
      data[i] = sum;
    }
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void all_gather(const float* send, std::span<const size_t> counts, float* out) override {
    const auto start = std::chrono::steady_clock::now();
    std::vector<int> receive_counts(size_), displacements(size_);
    int offset = 0;
    for (int other = 0; other < size_; ++other) {
      receive_counts[other] = static_cast<int>(counts[other]);
      displacements[other] = offset;
      offset += receive_counts[other];
    }
    MPI_Allgatherv(send, receive_counts[rank_], MPI_FLOAT, out, receive_counts.data(), displacements.data(), MPI_FLOAT, MPI_COMM_WORLD);
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void broadcast(void* data, size_t bytes, int root) override {
    MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
  }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // The server's engine thread, not the main thread, makes the calls: one thread at a time.
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  }
  return std::make_unique<MpiCommunicator>();
}
#else
bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator(int*, char***) { return nullptr; }
#endif

}  // namespace gemma4rt::parallel
