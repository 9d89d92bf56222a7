// How quantised linear weights are stored in a checkpoint, for the loader and for doctor alike:
// q8 is I8 [..., cols] with F32 block scales NAME_scale [..., blocks]; q4 is U8 [..., q4_row_bytes(cols)]
// of nibbles with F16 block scales NAME_scale [..., blocks], in a file whose __metadata__ names the layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace gemma4rt {

// True for the stored dtypes of quantised weights ("I8": q8, "U8": q4), which come with block scales.
bool is_quantized_dtype(const std::string& dtype_name);

// The shape a tensor of logical (config) shape `shape` has when stored as `dtype_name`: q4 packs two values
// a byte, every other dtype stores the shape as it is.
std::vector<int64_t> stored_shape_of(const std::string& dtype_name, std::vector<int64_t> shape);

// Why a q4 tensor's file cannot be read (its __metadata__ names no layout or another one), or "".
std::string q4_layout_problem(const StoredTensor& stored);

// Why the block scales NAME_scale of quantised tensor `stored` (logical shape `shape`) cannot be used
// (missing, another dtype or shape), or "".
std::string block_scales_problem(const Checkpoint& checkpoint, const StoredTensor& stored, const std::vector<int64_t>& shape);

}  // namespace gemma4rt
