#include "tools/engine_flags.h"

#include <algorithm>
#include <thread>

#include "backend/registry.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

// Under mpirun, the processes on one machine share its cores. When mpirun bound each process to its own
// cores, the affinity mask already says how many are ours; when it did not (oversubscription, or
// --bind-to none), every process sees them all and takes its share.
int threads_per_process(int processes_here) {
  const int mine = available_cores();
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (mine < machine) return mine;
  return std::max(1, machine / processes_here);
}

}  // namespace

std::string chosen_backend(const std::string& backend, bool reference, int device) {
  if (reference && backend != "cpu" && backend != "reference") fail("--reference is --backend reference; it cannot be combined with --backend {}", backend);
  const std::string name = reference ? "reference" : backend;
  // Only a GPU backend has devices to pick; a silently ignored index would let a user think the GPU ran.
  if (device >= 0 && name != "vulkan") {
    fail("--device {} picks a GPU, but the {} backend runs on this machine's CPU cores: drop --device or add --backend vulkan",
         device, name);
  }
  return name;
}

void EngineFlags::add_to(CLI::App& command, TensorParallelRanks ranks) {
  command.add_option("--backend", backend,
                     "Where the forward pass runs: cpu (SIMD kernels, the default), reference (scalar fp32, the verification "
                     "path; slow), or vulkan (a GPU) in builds that have it")
      ->check(CLI::IsMember(backend::backend_names()));
  command.add_option("--dtype", dtype, "Weight format (default: the checkpoint's own, bf16 for real checkpoints; f32 on the reference backend)")
      ->check(CLI::IsMember({"f32", "bf16", "q8", "q4"}));
  command.add_option("--kv", kv, "KV cache element format (default bf16; f32 on the reference backend)")->check(CLI::IsMember({"f32", "bf16"}));
  command.add_flag("--reference", reference, "The same as --backend reference");
  command.add_option("--device", device, "GPU backends: the device index (gemma4rt devices lists them; default: the first discrete GPU, then integrated)")
      ->check(zero_or_more());
  const bool threads_only = ranks == TensorParallelRanks::kThreadsOnly;
  command.add_option("--threads", threads,
                     threads_only ? "Worker threads (default: one per core this process may use)"
                                  : "Worker threads (default: one per core this process may use; under mpirun, its share of the machine's)")
      ->check(thread_count());
  command.add_option("--tp", tensor_parallel,
                     threads_only ? "Tensor-parallel ranks, as threads of this process (default 1)"
                                  : "Tensor-parallel ranks: threads of this process, or the processes of `mpirun -np N` (default 1)")
      ->check(CLI::Range(1, 256));
}

EngineOptions EngineFlags::options(std::unique_ptr<parallel::Communicator>* communicator) const {
  EngineOptions options;
  const int launched = parallel::launched_size();
  if (launched > 1) {
    // Started by mpirun: every process is one rank.
    if (launched != tensor_parallel) fail("mpirun started {} processes but --tp is {}; they must agree", launched, tensor_parallel);
    if (communicator == nullptr) fail("this command does not run under mpirun");
    *communicator = parallel::make_mpi_communicator(nullptr, nullptr);
    if (!*communicator) fail("this gemma4rt was built without MPI: install libopenmpi-dev and rebuild, or use --tp without mpirun");
    options.communicator = communicator->get();
  } else {
    options.tensor_parallel = tensor_parallel;
  }
  options.threads = threads;
  if (launched > 1 && threads == 0) options.threads = threads_per_process(parallel::launched_local_size());
  options.backend = chosen_backend(backend, reference, device);
  options.device = device;
  // A device with its own memory gets its weights uploaded once: show how far that is.
  options.on_weight_upload = [bar = std::shared_ptr<ProgressBar>()](uint64_t done, uint64_t total) mutable {
    if (!bar) bar = std::make_shared<ProgressBar>("uploading weights", total);
    bar->update(done);
    if (done >= total) bar->finish();
  };
  if (options.backend == "reference" && !dtype.empty() && dtype != "f32") fail("--backend reference computes in f32; it cannot be combined with --dtype {}", dtype);
  if (options.backend == "reference" && kv == "bf16") fail("--backend reference keeps the KV cache in f32; it cannot be combined with --kv bf16");
  if (!dtype.empty()) options.weight_format = parse_weight_format(dtype);
  if (!kv.empty()) options.kv_format = parse_kv_format(kv);
  return options;
}

}  // namespace gemma4rt::tools
