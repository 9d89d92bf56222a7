// Scalar reference kernels. They define what every fast kernel must compute and are the kernels of
// the fp32 verification path. They know about tensors and numbers, never about Gemma layers.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace gemma4rt::reference {

// y[r, o] = sum_i x[r, i] * w[o, i] for a weight stored [out, in] (PyTorch nn.Linear layout), any dtype.
void matmul(const float* x, int64_t rows, const TensorView& weight, float* y);
// The same for output features [first_out, last_out) only: threads splitting the outputs between them
// compute every value exactly as one thread would.
void matmul(const float* x, int64_t rows, const TensorView& weight, float* y, int64_t first_out, int64_t last_out);

// out = x / sqrt(mean(x^2) + eps) * weight  (weight may be null: the weightless norm).
void rms_norm(const float* x, int64_t size, const float* weight, float eps, float* out);

// GELU with the tanh approximation (torch gelu(approximate="tanh")).
float gelu_tanh(float x);

// In-place softmax over `size` values, computed in fp32 with the maximum subtracted first.
void softmax(float* values, int64_t size);

// log(sum_i exp(values[i])) with the maximum subtracted first, the sum in double; size 0: -inf; a
// maximum that is not finite (all -inf, any +inf) is returned as it is.
float log_sum_exp(const float* values, int64_t size);

// The index of the largest value, the lowest on ties; NaN is never chosen; 0 when nothing is larger
// than -inf (core/argmax.h, the host's one definition).
int64_t argmax(const float* values, int64_t size);

// Rotates one head in place, "rotate half" convention: pairs (j, j + head_dim/2).
void apply_rope(float* head, int64_t head_dim, const float* cos, const float* sin);

// One query against a set of cached key/value rows: out = softmax(q . k_j) @ v_j over the listed slots.
// Rows are found at base + slot * row_stride. `scores` needs room for slots.size() floats.
void attend(const float* query, int64_t head_dim, const float* keys, const float* values, int64_t row_stride,
            std::span<const int32_t> slots, float* scores, float* out);
// attend's two phases: scores[j] = q . k_j (double sums); then softmax of the scores (left in `scores`)
// and out = sum_j p_j v_j.
void attention_scores(const float* query, int64_t head_dim, const float* keys, int64_t row_stride, std::span<const int32_t> slots,
                      float* scores);
void weigh_values(float* scores, int64_t head_dim, const float* values, int64_t row_stride, std::span<const int32_t> slots, float* out);

}  // namespace gemma4rt::reference
