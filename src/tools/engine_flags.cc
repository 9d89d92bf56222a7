#include "tools/engine_flags.h"

#include "core/error.h"

namespace gemma4rt::tools {

void EngineFlags::add_to(CLI::App& command) {
  command.add_option("--dtype", dtype, "Weight format of the fast kernels (default: the checkpoint's own, bf16 for real checkpoints)")
      ->check(CLI::IsMember({"f32", "bf16", "q8"}));
  command.add_option("--kv", kv, "KV cache element format (default bf16; f32 with --reference)")->check(CLI::IsMember({"f32", "bf16"}));
  command.add_flag("--reference", reference, "Run the scalar fp32 reference kernels (the verification path; slow)");
  command.add_option("--threads", threads, "Worker threads (default: one per core)")->check(CLI::NonNegativeNumber);
}

EngineOptions EngineFlags::options() const {
  EngineOptions options;
  options.threads = threads;
  options.reference = reference;
  if (reference && !dtype.empty() && dtype != "f32") fail("--reference computes in f32; it cannot be combined with --dtype {}", dtype);
  if (reference && kv == "bf16") fail("--reference keeps the KV cache in f32; it cannot be combined with --kv bf16");
  if (!reference) {
    if (dtype == "f32") options.weight_format = WeightFormat::kF32;
    if (dtype == "bf16") options.weight_format = WeightFormat::kBF16;
    if (dtype == "q8") options.weight_format = WeightFormat::kQ8;
  }
  if (kv == "f32") options.kv_format = KvFormat::kF32;
  if (kv == "bf16") options.kv_format = KvFormat::kBF16;
  return options;
}

}  // namespace gemma4rt::tools
