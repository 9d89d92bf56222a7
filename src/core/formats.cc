#include "core/formats.h"

namespace gemma4rt {

const char* format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kQ8: return "q8";
    case WeightFormat::kQ4: return "q4";
  }
  return "?";
}

const char* format_name(KvFormat format) { return format == KvFormat::kF32 ? "f32" : "bf16"; }

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "f32" || name == "fp32") return WeightFormat::kF32;
  if (name == "bf16") return WeightFormat::kBF16;
  if (name == "q8") return WeightFormat::kQ8;
  if (name == "q4") return WeightFormat::kQ4;
  return std::nullopt;
}

std::optional<KvFormat> parse_kv_format(std::string_view name) {
  if (name == "f32" || name == "fp32") return KvFormat::kF32;
  if (name == "bf16") return KvFormat::kBF16;
  return std::nullopt;
}

}  // namespace gemma4rt
