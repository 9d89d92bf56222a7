// Multi-process tensor parallelism for the server: rank 0 schedules, and before each forward pass it
// broadcasts the step's rows; every other rank runs the same forward with them, so all ranks take
// part in the same collectives in the same order. Rank 0 ends the mirror with a stop message.
#pragma once

#include <span>

#include "engine/transformer.h"
#include "parallel/communicator.h"

namespace gemma4rt {

// Rank 0: send one step (called from BatchScheduler's before_forward hook).
void broadcast_step(parallel::Communicator& communicator, std::span<const BatchRow> rows, std::span<const int> logit_rows);
// Rank 0: tell the followers to return.
void broadcast_stop(parallel::Communicator& communicator);
// Ranks > 0: run steps until rank 0 stops.
void follow_steps(parallel::Communicator& communicator, Transformer& transformer);

}  // namespace gemma4rt
