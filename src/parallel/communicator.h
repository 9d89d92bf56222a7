// How tensor-parallel ranks exchange activations. One interface, two implementations: ranks as threads
// of one process (InProcessGroup: one machine, tests) and ranks as MPI processes (one machine or many).
// Every collective is called by all ranks in the same order; results are identical on every rank, and
// sums add the ranks' contributions in rank order so every rank gets bit-identical values.
#pragma once

#include <barrier>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace gemma4rt::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] = sum over ranks of data[i], in rank order.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  // Concatenates every rank's `counts[rank]` floats into `out` (rank 0 first).
  virtual void all_gather(const float* send, std::span<const size_t> counts, float* out) = 0;
  // Copies root's bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Seconds spent inside collectives, for the communication-time figure of the benchmarks.
  double communication_seconds() const { return communication_seconds_; }

 protected:
  double communication_seconds_ = 0.0;
};

// A group of `size` ranks living in one process, one thread each.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  std::unique_ptr<Communicator> communicator(int rank);

 private:
  friend class InProcessCommunicator;
  int size_;
  std::barrier<> barrier_;
  std::vector<const float*> sources_;   // each rank's buffer, published between barriers
  std::vector<void*> broadcast_sources_;
};

// MPI_COMM_WORLD as a communicator (nullptr when gemma4rt was built without MPI). Initialises MPI once.
std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv);
bool mpi_available();
// The rank and size from the environment mpirun gives its processes, or 0 and 1.
int launched_rank();
int launched_size();
// How many of those processes share this machine (1 when not started by mpirun).
int launched_local_size();

}  // namespace gemma4rt::parallel
