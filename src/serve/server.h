// gemma4rt's OpenAI-compatible HTTP server: routes, authentication, streaming (SSE) and draining.
// Requests are validated (openai_api), rendered and tokenized here, then run by the BatchScheduler;
// generated tokens come back through a per-request session that the HTTP thread turns into
// OpenAI responses or chunks.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "constrain/token_table.h"
#include "engine/batch_scheduler.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace gemma4rt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                 // empty: no authentication
  double request_timeout_seconds = 600.0;
  size_t max_body_bytes = size_t{8} << 20;
  int http_threads = 0;                // connections served at once; 0: far more than any running and queued requests
  bool log_requests = true;            // one stderr line per answered request (route, status, tokens, timings)
};

// What the server serves once loading finished.
struct ServingState {
  ServedModel model;
  std::unique_ptr<BatchScheduler> scheduler;
  std::unique_ptr<Tokenizer> tokenizer;

  // The vocabulary as structured output walks it, built by the first request that needs it.
  std::shared_ptr<const constrain::TokenTable> token_table();

 private:
  std::once_flag token_table_built_;
  std::shared_ptr<const constrain::TokenTable> token_table_;
};

class Server {
 public:
  explicit Server(const ServerOptions& options);
  ~Server();

  // Binds the port (throws Error if it cannot) and serves on a background thread; /health answers 503
  // until set_ready().
  void start();
  void set_ready(std::shared_ptr<ServingState> state);
  // Stops accepting (new requests get 503), lets in-flight requests finish, then stops the listener.
  void drain();
  // Blocks until the listener stopped.
  void wait();
  int port() const { return port_; }

 private:
  void handle_completion(const httplib::Request& request, const std::string& body, httplib::Response& response, bool chat);
  bool authorized(const httplib::Request& request, httplib::Response& response);
  // Whether the model has loaded; if not, answers 503 on `route`.
  bool model_ready(httplib::Response& response, const std::string& route);
  void send_error(httplib::Response& response, const ApiError& error, const std::string& route);
  void log_request(const std::string& route, int status, const std::string& detail) const;
  nlohmann::json tokenize(const nlohmann::json& body) const;    // throws ApiError
  nlohmann::json detokenize(const nlohmann::json& body) const;  // throws ApiError
  nlohmann::json model_object() const;

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::shared_ptr<ServingState> state_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> active_responses_{0};
  std::atomic<uint64_t> next_id_{1};
  Metrics metrics_;
  int port_ = 0;
  std::unique_ptr<std::thread> listener_;
  int listening_socket_ = -1;  // the bound socket httplib accepts on, seen through its socket-options hook
};

}  // namespace gemma4rt::serve
