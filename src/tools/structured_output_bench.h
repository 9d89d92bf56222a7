// bench --json-object / --json-schema: what structured output costs per decode step. The mask of
// each step (automaton walk or cache hit, then -inf on the logits) is timed on its own over a long
// generation, and the decode rate of a constrained greedy generation (logits path, mask, argmax) is
// set against the unconstrained one (argmax on the backend).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "constrain/grammar.h"
#include "engine/transformer.h"
#include "tokenizer/tokenizer.h"

namespace gemma4rt::tools {

// Decodes `tokens` tokens under the constraint, sampled at temperature 1 from position 0 for the mask
// figures (a fresh matcher starts when an output completes), then greedy in blocks that alternate with
// unconstrained greedy blocks over the same positions for the two rates.
nlohmann::json bench_structured_output(Transformer& transformer, const Tokenizer& tokenizer,
                                       const std::shared_ptr<const constrain::Grammar>& grammar, int tokens);

}  // namespace gemma4rt::tools
