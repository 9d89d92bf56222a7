// gemma4rt serve: the OpenAI-compatible HTTP server. The port is bound first so /health can answer
// 503 while the model loads; SIGTERM or SIGINT stop new requests (503), let in-flight ones finish and
// exit 0.
#include <csignal>
#include <pthread.h>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/batch_scheduler.h"
#include "engine/step_mirror.h"
#include "model/weights.h"
#include "serve/server.h"
#include "tokenizer/chat_format.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace gemma4rt::tools {
namespace {

struct ServeFlags {
  std::string model_dir;
  std::string alias;
  serve::ServerOptions server;
  int parallel = 4;
  int context_tokens = 4096;
  int max_queue = 64;
  int prefill_chunk = 128;
  bool no_prefix_cache = false;
  bool full_sliding_cache = false;
  double max_body_mb = 8.0;
  EngineFlags engine;
};

int serve_model(ServeFlags flags) {
  // Termination signals are taken by one thread with sigwait; every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Under mpirun, rank 0 serves HTTP and schedules; the other ranks mirror its engine steps.
  std::unique_ptr<parallel::Communicator> communicator;
  EngineOptions options = flags.engine.options(&communicator);
  options.context_tokens = flags.context_tokens;
  options.sequences = flags.parallel;
  // One step holds a decode row per running sequence plus one prompt chunk.
  options.max_chunk_tokens = flags.parallel + flags.prefill_chunk;
  options.full_sliding_cache = flags.full_sliding_cache;
  if (communicator && communicator->rank() != 0) {
    auto model = Model::load(flags.model_dir);
    Transformer transformer(*model, options);
    follow_steps(*communicator, transformer);
    return 0;
  }

  flags.server.max_body_bytes = static_cast<size_t>(flags.max_body_mb * 1024 * 1024);
  serve::Server server(flags.server);
  server.start();
  fmt::print(stderr, "gemma4rt serve: listening on http://{}:{} (loading {})\n", flags.server.host, server.port(), flags.model_dir);

  std::atomic<bool> stop_requested{false};
  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    stop_requested.store(true);
    fmt::print(stderr, "gemma4rt serve: signal {}: draining\n", signal);
    server.drain();
  });

  std::unique_ptr<Model> model;
  std::unique_ptr<Transformer> transformer;
  try {
    model = Model::load(flags.model_dir);
    const ModelConfig& config = model->config();
    auto state = std::make_shared<serve::ServingState>();
    const auto tokenizer_path = std::filesystem::path(flags.model_dir) / "tokenizer.json";
    if (!std::filesystem::exists(tokenizer_path)) fail("{}: file not found (the server needs the checkpoint's tokenizer)", tokenizer_path.string());
    state->tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path));

    transformer = std::make_unique<Transformer>(*model, options);

    state->model.checkpoint_name = std::filesystem::path(flags.model_dir).lexically_normal().filename().string();
    state->model.id = flags.alias.empty() ? state->model.checkpoint_name : flags.alias;
    if (state->model.id.empty()) state->model.id = "gemma4";
    state->model.tokenizer = state->tokenizer.get();
    state->model.prompt_style = detect_generation_prompt_style(
        flags.model_dir, config.has_per_layer_inputs() ? GenerationPromptStyle::kESeries : GenerationPromptStyle::kLargeModel);
    state->model.context_tokens = flags.context_tokens;
    state->model.vocab_size = config.vocab_size;
    state->model.bos_token_id = config.bos_token_id;
    state->model.eos_token_ids = config.eos_token_ids;
    state->model.backend = fmt::format("{} ({})", transformer->backend().name(), transformer->backend().kernels());
    state->model.slots = flags.parallel;
    BatchScheduler::Options scheduler_options;
    scheduler_options.max_queue = flags.max_queue;
    scheduler_options.prefill_chunk = flags.prefill_chunk;
    scheduler_options.reuse_prefixes = !flags.no_prefix_cache;
    if (communicator) {
      scheduler_options.before_forward = [&communicator](std::span<const BatchRow> rows, std::span<const int> logit_rows) {
        broadcast_step(*communicator, rows, logit_rows);
      };
    }
    state->scheduler = std::make_unique<BatchScheduler>(*transformer, scheduler_options);
    if (!stop_requested.load()) {
      server.set_ready(state);
      fmt::print(stderr, "gemma4rt serve: ready ({} KV slots of {} tokens, queue {})\n", flags.parallel, flags.context_tokens, flags.max_queue);
    }
    server.wait();
    signal_thread.join();
    state.reset();  // stops the engine thread
    if (communicator) broadcast_stop(*communicator);
  } catch (...) {
    // Wake the signal thread so it can end, then report the error.
    pthread_kill(signal_thread.native_handle(), SIGTERM);
    signal_thread.join();
    if (communicator) broadcast_stop(*communicator);  // the other ranks must not wait for steps forever
    throw;
  }
  fmt::print(stderr, "gemma4rt serve: stopped\n");
  return 0;
}

}  // namespace

Action add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* command = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  command->add_option("--model", flags->model_dir, "Checkpoint directory")->required();
  command->add_option("--host", flags->server.host, "Address to listen on");
  command->add_option("--port", flags->server.port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  command->add_option("--parallel", flags->parallel, "Sequences decoded together (KV slots)")->check(CLI::Range(1, 256));
  command->add_option("--ctx", flags->context_tokens, "Context length of each KV slot")->check(at_least_one());
  command->add_option("--max-queue", flags->max_queue, "Requests that may wait for a slot; more get 429")->check(zero_or_more());
  command->add_option("--api-key", flags->server.api_key, "Require 'Authorization: Bearer KEY' on /v1 routes");
  command->add_option("--timeout", flags->server.request_timeout_seconds, "Per-request time limit in seconds (0: none)")->check(zero_or_more());
  command->add_option("--prefill-chunk", flags->prefill_chunk, "Prompt tokens a newcomer adds per step")->check(CLI::Range(1, 8192));
  command->add_flag("--no-prefix-cache", flags->no_prefix_cache,
                    "Compute every prompt in full (by default a prompt that starts like an earlier request, e.g. the next turn of a "
                    "chat, starts from the K/V that request left in its slot)");
  command->add_flag("--full-sliding-cache", flags->full_sliding_cache,
                    "Sliding-window layers keep the whole context, not a ring of the window plus a chunk: more KV memory, "
                    "but the next turn of a chat reuses its prefix even when the previous answer comes back changed "
                    "(thinking stripped, a long answer after the large models' empty thought channel)");
  command->add_option("--alias", flags->alias, "Model name reported by /v1/models (default: the directory name)");
  command->add_option("--max-body-mb", flags->max_body_mb, "Largest request body accepted")->check(at_least_one());
  flags->engine.add_to(*command);
  return [flags] { return serve_model(*flags); };
}

}  // namespace gemma4rt::tools
