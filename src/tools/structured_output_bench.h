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

// `free_ms_per_token`: the unconstrained decode step it is compared with. Decodes `tokens` tokens
// twice from position 0 (sampled at temperature 1 for the mask figures, greedy for the rate); when
// the output completes, a fresh matcher starts the next one.
nlohmann::json bench_structured_output(Transformer& transformer, const Tokenizer& tokenizer,
                                       const std::shared_ptr<const constrain::Grammar>& grammar, int tokens, double free_ms_per_token);

}  // namespace gemma4rt::tools
