// The engine flags every model-running subcommand shares: --backend (--reference), --dtype, --kv, --device,
// --threads, --tp.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/transformer.h"

namespace gemma4rt::tools {

// Whether a command's --tp ranks may be the processes of mpirun, or only threads of this process (verify
// runs the reference beside them).
enum class TensorParallelRanks { kThreadsOrProcesses, kThreadsOnly };

struct EngineFlags {
  std::string dtype;      // "", "f32", "bf16", "q8", "q4"
  std::string kv;         // "", "f32", "bf16"
  std::string backend = "cpu";
  bool reference = false;  // --reference: the same as --backend reference
  int threads = 0;
  int device = -1;
  int tensor_parallel = 1;

  void add_to(CLI::App& command, TensorParallelRanks ranks = TensorParallelRanks::kThreadsOrProcesses);
  // Throws Error for inconsistent choices. Under mpirun (more than one launched process) this process
  // becomes one rank of an MPI group of --tp ranks; `communicator` then owns that connection.
  EngineOptions options(std::unique_ptr<parallel::Communicator>* communicator = nullptr) const;
};

// The backend --backend and --reference name together. Refuses the two naming different backends, and a
// --device index for a backend that has no devices to pick (cpu, reference).
std::string chosen_backend(const std::string& backend, bool reference, int device);

}  // namespace gemma4rt::tools
