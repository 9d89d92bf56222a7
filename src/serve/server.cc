#include "serve/server.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_input.h"
#include "serve/output_parser.h"
#include "serve/stop_strings.h"

namespace gemma4rt::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// While a response waits for tokens, something is written this often so a vanished client is noticed.
constexpr auto kHeartbeatInterval = std::chrono::milliseconds(250);

// Connections served at once when ServerOptions::http_threads is 0: every open connection holds a thread
// (running and queued requests, idle keep-alive ones, clients still sending), so this is far above any
// queue limit in use. It is lowered to what the open-file limit leaves room for.
constexpr size_t kMaxHttpThreads = 8192;
// File descriptors kept for everything but connections (checkpoint files, logs, the listener).
constexpr size_t kReservedDescriptors = 256;

// Debian's httplib is a compiled library that listens with a backlog of 5: a burst of clients starting
// together would see dropped SYNs and retransmits a second or more later.
constexpr int kListenBacklog = 1024;

// A request line, headers or body that stall this long end the connection: a client that sends half a
// request must not hold a thread for long.
constexpr auto kIncompleteRequestTimeout = std::chrono::seconds(5);

// Raises the soft open-file limit to the hard one (every connection is a descriptor; the usual soft
// limit of 1024 would refuse clients long before the thread cap) and returns the connections it allows.
size_t connection_limit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return kMaxHttpThreads;
  if (files.rlim_cur < files.rlim_max) {
    rlimit raised = files;
    raised.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  }
  if (files.rlim_cur == RLIM_INFINITY) return kMaxHttpThreads;
  const size_t descriptors = static_cast<size_t>(files.rlim_cur);
  return descriptors > 2 * kReservedDescriptors ? std::min(kMaxHttpThreads, descriptors - kReservedDescriptors) : descriptors / 2;
}

// The routes and their methods, for 405 answers.
constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kRoutes = {{{"/v1/chat/completions", "POST"},
                                                                                 {"/v1/completions", "POST"},
                                                                                 {"/v1/models", "GET"},
                                                                                 {"/health", "GET"},
                                                                                 {"/metrics", "GET"},
                                                                                 {"/tokenize", "POST"},
                                                                                 {"/detokenize", "POST"},
                                                                                 {"/props", "GET"}}};

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One generated token as the HTTP side sees it: the text it released (after stop strings) and, when
// asked for, its log-probabilities.
struct Piece {
  std::string text;
  int32_t token = -1;
  std::optional<float> logprob;
  std::vector<TokenLogprob> top_logprobs;
};

// Shared by the engine thread (producer) and the HTTP thread (consumer) of one request.
struct Session {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Piece> pieces;
  bool finished = false;
  std::string finish_reason;
  std::string error;
  int completion_tokens = 0;
  std::shared_ptr<SequenceHandle> handle;
  // Timing, for the latency histograms and the request's log line.
  Clock::time_point received = Clock::now();
  std::optional<Clock::time_point> last_token;
  double time_to_first_token = -1.0;

  // Engine-thread state.
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<StopStringFilter> stops;
  bool stopped_by_string = false;

  void push(Piece piece) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      pieces.push_back(std::move(piece));
    }
    changed.notify_all();
  }
};

// The token's text for logprobs: its piece with the word-boundary marker shown as a space.
std::string token_piece(const Tokenizer& tokenizer, int32_t token) {
  const int32_t ids[1] = {token};
  return tokenizer.decode(ids, false);
}

// The bytes a token stands for. A byte-fallback piece `<0xHH>` is that one byte, although its text
// alone decodes to U+FFFD when the byte is part of a longer character; anything else is its text.
std::string token_raw_bytes(const Tokenizer& tokenizer, int32_t token) {
  if (token >= 0 && token < tokenizer.vocab_size()) {
    const std::string& piece = tokenizer.token_text(token);
    const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>' && hex(piece[3]) && hex(piece[4])) {
      return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    }
  }
  return token_piece(tokenizer, token);
}

json token_bytes(const std::string& bytes) {
  json list = json::array();
  for (unsigned char c : bytes) list.push_back(static_cast<int>(c));
  return list;
}

json chat_logprob_entry(const Tokenizer& tokenizer, const Piece& piece) {
  const std::string text = token_piece(tokenizer, piece.token);
  json top = json::array();
  for (const TokenLogprob& alternative : piece.top_logprobs) {
    top.push_back({{"token", token_piece(tokenizer, alternative.token)},
                   {"logprob", alternative.logprob},
                   {"bytes", token_bytes(token_raw_bytes(tokenizer, alternative.token))}});
  }
  return {{"token", text}, {"logprob", *piece.logprob}, {"bytes", token_bytes(token_raw_bytes(tokenizer, piece.token))}, {"top_logprobs", top}};
}

// Request text can reach a response (an error message quoting the body, a path, a model alias):
// invalid UTF-8 becomes U+FFFD instead of an exception from the serializer.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& data) { return "data: " + dump(data) + "\n\n"; }

// A request body parsed as bounded JSON (core/json_input); what is wrong with it is a 400.
json request_json(const std::string& body) {
  try {
    return parse_json(body, "the request body");
  } catch (const Error& error) {
    throw invalid_request(error.what());
  }
}

// HTTP worker threads, started as connections need them and reused; a thread idle for kIdleThread
// ends, so a burst of connections does not keep thousands of threads for the life of the server. A
// fixed pool would let long streams and queued requests (each holds its connection's thread) take
// every thread, so /health, /metrics and the 429 of a full queue would wait behind them unanswered.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}

  void enqueue(std::function<void()> job) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reap_exited();
      const size_t available = live_ - busy_;
      if (jobs_.size() + 1 > available && live_ < max_threads_) {
        try {
          // The new thread cannot end before it is recorded: it needs the lock held here.
          std::thread thread([this] { work(); });
          const std::thread::id id = thread.get_id();
          threads_.emplace(id, std::move(thread));
          ++live_;
        } catch (const std::system_error&) {
          // No thread to be had: the connection waits for a running one. With none at all, there is
          // nothing better than to serve it here, on the listener.
          if (live_ == 0) job_to_run_here_ = true;
        }
      }
      if (!job_to_run_here_) jobs_.push_back(std::move(job));
    }
    if (job_to_run_here_) {
      job_to_run_here_ = false;
      job();
      return;
    }
    changed_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    // The listener no longer enqueues: the list of threads is final.
    for (auto& [id, thread] : threads_) thread.join();
    threads_.clear();
  }

 private:
  static constexpr auto kIdleThread = std::chrono::seconds(10);

  void work() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        const bool woken = changed_.wait_for(lock, kIdleThread, [this] { return stopping_ || !jobs_.empty(); });
        if (!woken || jobs_.empty()) {
          // Idle too long, or stopping with every accepted connection served: this thread ends.
          if (!stopping_) {
            --live_;
            exited_.push_back(std::this_thread::get_id());
          }
          return;
        }
        job = std::move(jobs_.front());
        jobs_.pop_front();
        ++busy_;
      }
      job();
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
  }

  // Joins threads that ended idle (they have returned from work(), so join does not wait long).
  void reap_exited() {
    for (const std::thread::id id : exited_) {
      auto found = threads_.find(id);
      if (found == threads_.end()) continue;
      found->second.join();
      threads_.erase(found);
    }
    exited_.clear();
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> jobs_;
  std::unordered_map<std::thread::id, std::thread> threads_;
  std::vector<std::thread::id> exited_;  // ended idle, not yet joined
  size_t live_ = 0;                      // threads running work()
  size_t busy_ = 0;
  bool stopping_ = false;
  bool job_to_run_here_ = false;  // only touched by the listener thread, the one caller of enqueue()
};

// The body of a POST, read by the handler itself: httplib's own reading refuses form-encoded bodies
// over 8 KiB (what `curl -d` sends), whatever --max-body-mb says.
struct BodyError {
  int status;
  std::string message;
};
std::variant<std::string, BodyError> read_body(const httplib::Request& request, const httplib::Response& response,
                                               const httplib::ContentReader& reader, size_t max_bytes) {
  std::string body;
  bool ok;
  if (request.is_multipart_form_data()) {
    ok = reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
    if (ok) return BodyError{400, "the request body must be JSON, not multipart form data"};
  } else {
    bool too_large = false;
    ok = reader([&](const char* data, size_t size) {
      // A chunked body has no Content-Length for httplib to check: the limit is applied as it arrives.
      if (body.size() + size > max_bytes) {
        too_large = true;
        return false;
      }
      body.append(data, size);
      return true;
    });
    if (too_large) return BodyError{413, fmt::format("the request body exceeds {} bytes", max_bytes)};
  }
  if (!ok) {
    // httplib sets 413 when the body is over the limit (also a chunked one, once it gets there).
    if (response.status == 413) return BodyError{413, fmt::format("the request body exceeds {} bytes", max_bytes)};
    return BodyError{400, "the request body could not be read"};
  }
  return body;
}

// Turns the session's pieces into OpenAI objects; used for both the streamed and the whole response.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, const ServingState& state, std::string id)
      : request_(request), state_(state), id_(std::move(id)), created_(unix_seconds()) {}

  // Consumes pieces; returns the stream chunks they produce (chat: content/reasoning/tool-call deltas).
  std::vector<json> consume(std::deque<Piece>& pieces) {
    std::vector<json> chunks;
    while (!pieces.empty()) {
      Piece piece = std::move(pieces.front());
      pieces.pop_front();
      json logprobs = nullptr;
      if (piece.logprob && piece.token >= 0) logprobs = record_logprob(piece);
      if (request_.chat) {
        OutputDelta delta = parser_.push(piece.text);
        json chunk = delta_chunk(delta, logprobs);
        if (!chunk.is_null()) chunks.push_back(std::move(chunk));
      } else {
        text_ += piece.text;
        if (!piece.text.empty() || !logprobs.is_null()) chunks.push_back(completion_chunk(piece.text, logprobs, nullptr));
      }
    }
    return chunks;
  }

  // The last chunks of a stream: what the parser held back, the finish reason, the usage.
  std::vector<json> finish_stream(const std::string& reason, int completion_tokens, int cached_prompt_tokens) {
    std::vector<json> chunks;
    if (request_.chat) {
      OutputDelta delta = parser_.finish();
      json chunk = delta_chunk(delta, nullptr);
      if (!chunk.is_null()) chunks.push_back(std::move(chunk));
      json last = chat_chunk(json::object(), nullptr);
      last["choices"][0]["finish_reason"] = finish_reason(reason);
      chunks.push_back(std::move(last));
    } else {
      chunks.push_back(completion_chunk("", nullptr, finish_reason(reason)));
    }
    if (request_.include_usage) {
      json usage_chunk = {{"id", id_}, {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created_}, {"model", state_.model.id}, {"choices", json::array()},
                          {"usage", usage(completion_tokens, cached_prompt_tokens)}};
      chunks.push_back(std::move(usage_chunk));
    }
    return chunks;
  }

  json first_chunk() { return chat_chunk({{"role", "assistant"}, {"content", ""}}, nullptr); }

  json whole(const std::string& reason, int completion_tokens, int cached_prompt_tokens) {
    json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (request_.chat) {
      parser_.finish();
      const ParsedOutput& parsed = parser_.result();
      tool_calls_seen_ = tool_calls_seen_ || !parsed.tool_calls.empty();
      json message = {{"role", "assistant"}, {"content", parsed.content}};
      if (parsed.reasoning) message["reasoning_content"] = *parsed.reasoning;
      if (!parsed.tool_calls.empty()) {
        json calls = json::array();
        for (const ToolCall& call : parsed.tool_calls) calls.push_back(tool_call_json(call, std::nullopt));
        message["tool_calls"] = calls;
        if (parsed.content.empty()) message["content"] = nullptr;
      }
      choice["message"] = message;
      choice["logprobs"] = request_.logprobs >= 0 ? json{{"content", chat_logprobs_}} : json(nullptr);
      choice["finish_reason"] = finish_reason(reason);
    } else {
      choice["text"] = text_;
      choice["logprobs"] = request_.logprobs >= 0 ? completion_logprobs_ : json(nullptr);
      choice["finish_reason"] = finish_reason(reason);
    }
    return {{"id", id_},
            {"object", request_.chat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", state_.model.id},
            {"choices", json::array({choice})},
            {"usage", usage(completion_tokens, cached_prompt_tokens)}};
  }

 private:
  std::string finish_reason(const std::string& reason) {
    if (reason == "stop" && tool_calls_seen_) return "tool_calls";
    if (reason == "stop" || reason == "length") return reason;
    return "stop";  // cancelled/timeout end a stream cleanly
  }

  // OpenAI's shape: cached_tokens are the prompt tokens an earlier request's K/V spared computing.
  json usage(int completion_tokens, int cached_prompt_tokens) const {
    const int prompt = static_cast<int>(request_.prompt_tokens.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_prompt_tokens}}}};
  }

  json record_logprob(const Piece& piece) {
    const Tokenizer& tokenizer = *state_.tokenizer;
    if (request_.chat) {
      json entry = chat_logprob_entry(tokenizer, piece);
      chat_logprobs_.push_back(entry);
      return {{"content", json::array({entry})}};
    }
    const std::string text = token_piece(tokenizer, piece.token);
    json top = json::object();
    for (const TokenLogprob& alternative : piece.top_logprobs) top[token_piece(tokenizer, alternative.token)] = alternative.logprob;
    if (completion_logprobs_.is_null()) {
      completion_logprobs_ = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    }
    completion_logprobs_["tokens"].push_back(text);
    completion_logprobs_["token_logprobs"].push_back(*piece.logprob);
    completion_logprobs_["top_logprobs"].push_back(top);
    // Offsets count the bytes of the text; a byte-fallback token adds its one byte, not its U+FFFD.
    const int offset = text_offset_;
    completion_logprobs_["text_offset"].push_back(offset);
    text_offset_ += static_cast<int>(token_raw_bytes(tokenizer, piece.token).size());
    return {{"tokens", {text}}, {"token_logprobs", {*piece.logprob}}, {"top_logprobs", {top}}, {"text_offset", {offset}}};
  }

  json tool_call_json(const ToolCall& call, std::optional<int> index) {
    json entry = {{"id", fmt::format("call_{}_{}", id_.substr(id_.find('-') + 1), tool_call_count_++)},
                  {"type", "function"},
                  {"function", {{"name", call.name}, {"arguments", call.arguments_json}}}};
    if (index) entry["index"] = *index;
    return entry;
  }

  json chat_chunk(json delta, json logprobs) {
    return {{"id", id_},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", state_.model.id},
            {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}})}};
  }

  json delta_chunk(const OutputDelta& delta, json logprobs) {
    json body = json::object();
    if (!delta.reasoning.empty()) body["reasoning_content"] = delta.reasoning;
    if (!delta.content.empty()) body["content"] = delta.content;
    if (!delta.completed_tool_calls.empty()) {
      tool_calls_seen_ = true;
      json calls = json::array();
      for (const ToolCall& call : delta.completed_tool_calls) calls.push_back(tool_call_json(call, streamed_tool_calls_++));
      body["tool_calls"] = calls;
    }
    if (body.empty() && logprobs.is_null()) return nullptr;
    return chat_chunk(std::move(body), std::move(logprobs));
  }

  json completion_chunk(const std::string& text, json logprobs, json finish) {
    return {{"id", id_},
            {"object", "text_completion"},
            {"created", created_},
            {"model", state_.model.id},
            {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
  }

  const ParsedRequest& request_;
  const ServingState& state_;
  std::string id_;
  int64_t created_;
  StreamingOutputParser parser_;
  std::string text_;
  json chat_logprobs_ = json::array();
  json completion_logprobs_ = nullptr;
  int text_offset_ = 0;
  int tool_call_count_ = 0;
  int streamed_tool_calls_ = 0;
  bool tool_calls_seen_ = false;
};

}  // namespace

Server::Server(const ServerOptions& options) : options_(options), http_(std::make_unique<httplib::Server>()) {}

Server::~Server() {
  if (http_ && http_->is_running()) http_->stop();
  if (listener_ && listener_->joinable()) listener_->join();
}

void Server::send_error(httplib::Response& response, const ApiError& error, const std::string& route) {
  response.status = error.status;
  // A full queue clears as sequences finish: clients may retry soon.
  if (error.status == 429) response.set_header("Retry-After", "1");
  response.set_content(dump(error_body(error)), "application/json");
  metrics_.count_request(route, error.status);
  log_request(route, error.status, error.what());
}

nlohmann::json Server::tokenize(const nlohmann::json& body) const {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  if (!body.contains("content") || !body["content"].is_string()) throw invalid_request("'content' must be a string", "content");
  auto flag = [&](const char* key) {
    if (!body.contains(key) || body[key].is_null()) return false;
    if (!body[key].is_boolean()) throw invalid_request(fmt::format("'{}' must be true or false", key), key);
    return body[key].get<bool>();
  };
  const bool add_special = flag("add_special"), with_pieces = flag("with_pieces");
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(state_->model.bos_token_id);
  const std::vector<int32_t> text_ids = state_->tokenizer->encode(body["content"].get_ref<const std::string&>());
  ids.insert(ids.end(), text_ids.begin(), text_ids.end());
  json tokens = json::array();
  for (const int32_t id : ids) {
    if (with_pieces) tokens.push_back({{"id", id}, {"piece", token_piece(*state_->tokenizer, id)}});
    else tokens.push_back(id);
  }
  return {{"tokens", tokens}};
}

nlohmann::json Server::detokenize(const nlohmann::json& body) const {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  if (!body.contains("tokens") || !body["tokens"].is_array()) throw invalid_request("'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& id : body["tokens"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= state_->model.vocab_size) {
      throw invalid_request(fmt::format("'tokens' holds {}, not a token id below {}", json_excerpt(id), state_->model.vocab_size), "tokens");
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return {{"content", state_->tokenizer->decode(ids)}};
}

void Server::log_request(const std::string& route, int status, const std::string& detail) const {
  if (options_.log_requests) fmt::print(stderr, "gemma4rt serve: {} {} {}\n", route, status, detail);
}

bool Server::model_ready(httplib::Response& response, const std::string& route) {
  if (ready_.load()) return true;
  send_error(response, ApiError(503, "server_error", "the model is still loading"), route);
  return false;
}

bool Server::authorized(const httplib::Request& request, httplib::Response& response) {
  if (options_.api_key.empty()) return true;
  const std::string expected = "Bearer " + options_.api_key;
  if (request.get_header_value("Authorization") == expected) return true;
  send_error(response, ApiError(401, "authentication_error", "missing or wrong API key (send 'Authorization: Bearer KEY')", {}, "invalid_api_key"),
             request.path);
  return false;
}

void Server::start() {
  httplib::Server& http = *http_;
  const size_t threads = options_.http_threads > 0 ? static_cast<size_t>(options_.http_threads) : connection_limit();
  http.new_task_queue = [threads] { return new ConnectionThreads(threads); };
  http.set_payload_max_length(options_.max_body_bytes);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and take
  // part of its traffic. SO_REUSEADDR alone still allows a quick restart after this one exits.
  // The listening socket is the only one httplib passes here; it is kept to raise the backlog once bound.
  http.set_socket_options([this](socket_t socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof(yes));
    listening_socket_ = socket;
  });
  http.set_read_timeout(kIncompleteRequestTimeout);
  // A client that announces a body over the limit gets the 413 instead of "100 Continue".
  http.set_expect_100_continue_handler([max_bytes = options_.max_body_bytes](const httplib::Request& request, httplib::Response& response) {
    if (request.get_header_value<uint64_t>("Content-Length") > max_bytes) {
      response.status = 413;
      return 413;
    }
    return 100;
  });
  // Two Content-Length headers that disagree make the body's end ambiguous (request smuggling).
  http.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    const size_t lengths = request.get_header_value_count("Content-Length");
    for (size_t index = 1; index < lengths; ++index) {
      if (request.get_header_value("Content-Length", index) != request.get_header_value("Content-Length", 0)) {
        send_error(response, ApiError(400, "invalid_request_error", "conflicting Content-Length headers"), request.path);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_write_timeout(30, 0);

  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    const bool ok = ready_.load() && !draining_.load();
    response.status = ok ? 200 : 503;
    response.set_content(dump({{"status", ok ? "ok" : (draining_.load() ? "draining" : "loading")}}), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    std::optional<SchedulerStats> stats;
    if (ready_.load()) stats = state_->scheduler->stats();
    response.set_content(metrics_.render(stats ? &*stats : nullptr, ready_.load(), draining_.load()), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
    if (!authorized(request, response)) return;
    if (!model_ready(response, "/v1/models")) return;
    response.set_content(dump({{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
    metrics_.count_request("/v1/models", 200);
  });
  // One model by id (OpenAI's models.retrieve).
  http.Get("/v1/models/(.+)", [this](const httplib::Request& request, httplib::Response& response) {
    if (!authorized(request, response)) return;
    if (!model_ready(response, "/v1/models")) return;
    const std::string id = request.matches[1];
    if (id != state_->model.id) {
      send_error(response, ApiError(404, "invalid_request_error", fmt::format("the model '{}' does not exist; this server serves '{}'", id, state_->model.id), "model", "model_not_found"),
                 "/v1/models");
      return;
    }
    response.set_content(dump(model_object()), "application/json");
    metrics_.count_request("/v1/models", 200);
  });
  // llama-server's tokenizer routes: {"content", "add_special", "with_pieces"} -> {"tokens"}, and
  // {"tokens"} -> {"content"}.
  for (const bool encode : {true, false}) {
    const std::string route = encode ? "/tokenize" : "/detokenize";
    http.Post(route, [this, encode, route](const httplib::Request& request, httplib::Response& response, const httplib::ContentReader& reader) {
      if (!authorized(request, response)) return;
      if (!model_ready(response, route)) return;
      auto body = read_body(request, response, reader, options_.max_body_bytes);
      if (const BodyError* error = std::get_if<BodyError>(&body)) {
        send_error(response, ApiError(error->status, "invalid_request_error", error->message), route);
        return;
      }
      try {
        const json parsed = request_json(std::get<std::string>(body));
        const json answer = encode ? tokenize(parsed) : detokenize(parsed);
        response.set_content(dump(answer), "application/json");
        metrics_.count_request(route, 200);
        log_request(route, 200, fmt::format("{} tokens", answer.contains("tokens") ? answer["tokens"].size() : parsed["tokens"].size()));
      } catch (const ApiError& error) {
        send_error(response, error, route);
      }
    });
  }
  // Model facts a client needs before sending requests (llama-server's /props, in our terms).
  http.Get("/props", [this](const httplib::Request& request, httplib::Response& response) {
    if (!authorized(request, response)) return;
    if (!model_ready(response, "/props")) return;
    const ServedModel& model = state_->model;
    response.set_content(dump({{"model", model.id},
                                {"n_ctx", model.context_tokens},
                                {"total_slots", model.slots},
                                {"backend", model.backend},
                                {"vocab_size", model.vocab_size},
                                {"bos_token_id", model.bos_token_id},
                                {"eos_token_ids", model.eos_token_ids},
                                {"max_body_bytes", options_.max_body_bytes},
                                {"version", GEMMA4RT_VERSION}}),
                         "application/json");
    metrics_.count_request("/props", 200);
  });
  for (const bool chat : {true, false}) {
    const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
    http.Post(route, [this, chat, route](const httplib::Request& request, httplib::Response& response, const httplib::ContentReader& reader) {
      auto body = read_body(request, response, reader, options_.max_body_bytes);
      if (const BodyError* error = std::get_if<BodyError>(&body)) {
        send_error(response, ApiError(error->status, "invalid_request_error", error->message), route);
        return;
      }
      handle_completion(request, std::get<std::string>(body), response, chat);
    });
  }
  // Anything the routes did not answer (unknown path, wrong method, body too large) gets an error object.
  http.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    std::string message = fmt::format("no route for {} {}", request.method, request.path);
    std::string type = "invalid_request_error";
    if (response.status == 404) {
      // A known route asked with the wrong method.
      for (const auto& [path, method] : kRoutes) {
        if (request.path != path) continue;
        response.status = 405;
        response.set_header("Allow", std::string(method));
        message = fmt::format("{} {} is not supported; use {}", request.method, request.path, method);
      }
    }
    if (response.status == 413) message = fmt::format("the request body exceeds {} bytes", options_.max_body_bytes);
    if (response.status >= 500) type = "server_error";
    response.set_content(dump(error_body(ApiError(response.status, type, message))), "application/json");
    metrics_.count_request("other", response.status);
  });
  http.set_exception_handler([this](const httplib::Request& request, httplib::Response& response, std::exception_ptr pointer) {
    std::string message = "internal error";
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const std::exception& error) {
      message = error.what();
    }
    send_error(response, ApiError(500, "server_error", message), request.path);
  });

  if (options_.port == 0) {
    port_ = http.bind_to_any_port(options_.host);
  } else {
    port_ = http.bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    const int error = errno;
    if (error == EADDRINUSE) fail("cannot listen on {}:{}: port in use (another server is running there)", options_.host, options_.port);
    fail("cannot listen on {}:{}: {}", options_.host, options_.port, error != 0 ? std::strerror(error) : "not an address of this machine");
  }
  if (listening_socket_ >= 0) {
    // listen() again on a listening socket only changes its backlog (Linux); a failure keeps httplib's 5.
    ::listen(listening_socket_, kListenBacklog);
    // A connection is handed over once its first bytes arrive: httplib waits for them by polling every
    // 10 ms, so thousands of clients that connect and send nothing would keep the CPUs busy.
    const int defer_seconds = static_cast<int>(kIncompleteRequestTimeout.count());
    setsockopt(listening_socket_, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_seconds, sizeof(defer_seconds));
  }
  listener_ = std::make_unique<std::thread>([this] { http_->listen_after_bind(); });
}

nlohmann::json Server::model_object() const {
  return {{"id", state_->model.id}, {"object", "model"}, {"created", 0}, {"owned_by", "gemma4rt"}, {"max_model_len", state_->model.context_tokens}};
}

void Server::set_ready(std::shared_ptr<ServingState> state) {
  state_ = std::move(state);
  ready_.store(true);
}

void Server::drain() {
  draining_.store(true);
  if (state_) state_->scheduler->drain();
  // The scheduler is idle; wait for the last responses to be written out.
  while (active_responses_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
}

void Server::wait() {
  if (listener_ && listener_->joinable()) listener_->join();
}

std::shared_ptr<const constrain::TokenTable> ServingState::token_table() {
  std::call_once(token_table_built_, [this] { token_table_ = std::make_shared<constrain::TokenTable>(*tokenizer, model.vocab_size); });
  return token_table_;
}

void Server::handle_completion(const httplib::Request& http_request, const std::string& http_body, httplib::Response& response, bool chat) {
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  if (!authorized(http_request, response)) return;
  if (draining_.load()) {
    send_error(response, ApiError(503, "server_error", "the server is shutting down"), route);
    return;
  }
  if (!model_ready(response, route)) return;
  ServingState& state = *state_;
  ParsedRequest request;
  try {
    const json body = request_json(http_body);
    request = chat ? parse_chat_request(body, state.model) : parse_completion_request(body, state.model);
  } catch (const ApiError& error) {
    send_error(response, error, route);
    return;
  }

  auto session = std::make_shared<Session>();
  // Chat output keeps its special tokens as text for the output parser; completions show plain text.
  session->decoder = std::make_unique<StreamingDecoder>(*state.tokenizer, /*skip_special_tokens=*/!chat);
  session->stops = std::make_unique<StopStringFilter>(request.stop);

  SequenceRequest sequence;
  sequence.prompt = request.prompt_tokens;
  sequence.max_tokens = request.max_tokens;
  sequence.sampling = request.sampling;
  sequence.presence_penalty = request.presence_penalty;
  sequence.frequency_penalty = request.frequency_penalty;
  sequence.logit_bias = request.logit_bias;
  sequence.ignore_eos = request.ignore_eos;
  sequence.reuse_prefix = request.cache_prompt;
  sequence.stop_token_ids = state.model.eos_token_ids;
  sequence.top_logprobs = request.logprobs;
  if (request.grammar) {
    const std::vector<int32_t> ends(state.model.eos_token_ids.begin(), state.model.eos_token_ids.end());
    try {
      sequence.constraint = std::make_shared<constrain::Matcher>(request.grammar, state.token_table(), ends);
    } catch (const Error& error) {
      send_error(response, invalid_request(error.what(), request.grammar->tools.empty() ? "response_format" : "tool_choice"), route);
      return;
    }
  }
  const double timeout = request.timeout_seconds.value_or(options_.request_timeout_seconds);
  if (timeout > 0) sequence.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
  sequence.on_token = [this, session](const TokenEvent& event) {
    Session& s = *session;
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      ++s.completion_tokens;
      if (s.last_token) {
        metrics_.observe_inter_token_latency(std::chrono::duration<double>(now - *s.last_token).count());
      } else {
        s.time_to_first_token = std::chrono::duration<double>(now - s.received).count();
        metrics_.observe_time_to_first_token(s.time_to_first_token);
      }
      s.last_token = now;
    }
    Piece piece;
    piece.token = event.token;
    piece.logprob = event.logprob;
    piece.top_logprobs = event.top_logprobs;
    if (event.is_stop_token) {
      // The stop token ends the answer; it is counted but not shown.
      piece.token = -1;
      s.push(std::move(piece));
      return true;
    }
    StopStringFilter::Result released = s.stops->push(s.decoder->push(event.token));
    piece.text = std::move(released.text);
    s.push(std::move(piece));
    if (released.stopped) s.stopped_by_string = true;
    return !released.stopped;
  };
  sequence.on_finish = [session](const std::string& reason, const std::string& error) {
    Session& s = *session;
    Piece rest;
    if (!s.stopped_by_string) {
      StopStringFilter::Result released = s.stops->push(s.decoder->finish());
      rest.text = released.text + (released.stopped ? std::string() : s.stops->finish());
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (!rest.text.empty()) s.pieces.push_back(std::move(rest));
      s.finished = true;
      s.finish_reason = reason;
      s.error = error;
    }
    s.changed.notify_all();
  };

  // Counted before the sequence can run: drain() must not see 0 between the sequence finishing and its
  // response being written, or it would stop the listener under that response.
  active_responses_++;
  try {
    session->handle = state.scheduler->submit(std::move(sequence));
  } catch (const Error& error) {
    active_responses_--;
    send_error(response, invalid_request(error.what()), route);
    return;
  }
  if (!session->handle) {
    active_responses_--;
    if (draining_.load()) {
      send_error(response, ApiError(503, "server_error", "the server is shutting down"), route);
    } else {
      send_error(response, ApiError(429, "rate_limit_error", "too many requests are waiting; try again later", {}, "queue_full"), route);
    }
    return;
  }
  metrics_.add_prompt_tokens(static_cast<int64_t>(request.prompt_tokens.size()));
  {
    std::unique_lock<std::mutex> lock(session->mutex);
    // The status line waits for the first token until the first heartbeat would be due: a sequence the
    // engine fails on at once (a broken checkpoint) then gets a real error status, not a 200.
    session->changed.wait_for(lock, kHeartbeatInterval, [&] { return session->finished || !session->pieces.empty(); });
    if (session->finished && session->finish_reason == "error" && session->pieces.empty()) {
      const std::string error = session->error;
      lock.unlock();
      active_responses_--;
      send_error(response, ApiError(500, "server_error", "generation failed: " + error), route);
      return;
    }
  }
  metrics_.count_request(route, 200);

  const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
  auto shared_request = std::make_shared<ParsedRequest>(std::move(request));
  auto builder = std::make_shared<ResponseBuilder>(*shared_request, state, id);
  auto done = std::make_shared<bool>(false);
  const size_t prompt_tokens = shared_request->prompt_tokens.size();
  auto finished_once = [this, session, done, route, prompt_tokens]() {
    if (*done) return;
    *done = true;
    int completion_tokens = 0;
    double time_to_first_token = -1.0;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(session->mutex);
      completion_tokens = session->completion_tokens;
      time_to_first_token = session->time_to_first_token;
      reason = session->finished ? session->finish_reason : "client gone";
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - session->received).count();
    metrics_.add_completion_tokens(completion_tokens);
    metrics_.observe_request_latency(seconds);
    log_request(route, 200,
                fmt::format("tokens in {} (cached {}) out {}, first token {}, {:.3f} s, {}", prompt_tokens,
                            session->handle->cached_prompt_tokens(), completion_tokens,
                            time_to_first_token >= 0 ? fmt::format("{:.3f} s", time_to_first_token) : "none", seconds, reason));
    active_responses_--;
  };

  // Both kinds of response are produced chunk by chunk, so a vanished client is noticed by a failed
  // write and its sequence cancelled. A whole (non-streamed) response writes heartbeat spaces, which
  // JSON allows before the value, until the answer is complete.
  const bool stream = shared_request->stream;
  const std::string content_type = stream ? "text/event-stream" : "application/json";
  auto started = std::make_shared<bool>(false);
  auto last_write = std::make_shared<Clock::time_point>(Clock::now());
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      content_type,
      // The builder refers to the parsed request: the lambda keeps both alive.
      [session, builder, shared_request, stream, started, chat, last_write](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& text) {
          if (!sink.write(text.data(), text.size())) {
            session->handle->cancel();
            return false;
          }
          *last_write = Clock::now();
          return true;
        };
        const auto heartbeat_due = [&] { return Clock::now() - *last_write >= kHeartbeatInterval; };
        if (stream && chat && !*started) {
          *started = true;
          if (!write(sse(builder->first_chunk()))) return false;
        }
        std::deque<Piece> pieces;
        bool finished = false;
        std::string reason;
        std::string error;
        int completion_tokens = 0;
        {
          std::unique_lock<std::mutex> lock(session->mutex);
          session->changed.wait_for(lock, kHeartbeatInterval, [&] { return session->finished || !session->pieces.empty(); });
          pieces.swap(session->pieces);
          finished = session->finished;
          reason = session->finish_reason;
          error = session->error;
          completion_tokens = session->completion_tokens;
        }
        const std::vector<json> chunks = builder->consume(pieces);
        if (stream) {
          for (const json& chunk : chunks) {
            if (!write(sse(chunk))) return false;
          }
          if (chunks.empty() && !finished && heartbeat_due() && !write(": keep-alive\n\n")) return false;
        } else if (!finished && heartbeat_due() && !write(" ")) {
          return false;
        }
        if (!finished) return true;
        if (reason == "error") {
          // The engine failed after the status wait: the status line (200) is already out, so the error
          // travels in the body, as an error event of the stream or an error object instead of the completion.
          const json failure = error_body(ApiError(500, "server_error", "generation failed: " + error));
          if (!write(stream ? sse(failure) + "data: [DONE]\n\n" : dump(failure))) return false;
        } else if (stream) {
          for (const json& chunk : builder->finish_stream(reason, completion_tokens, session->handle->cached_prompt_tokens())) {
            if (!write(sse(chunk))) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
        } else {
          if (!write(dump(builder->whole(reason, completion_tokens, session->handle->cached_prompt_tokens())))) return false;
        }
        sink.done();
        return true;
      },
      [session, finished_once](bool) {
        // However the response ended (done, or the client went away), the sequence need not run on.
        session->handle->cancel();
        finished_once();
      });
}

}  // namespace gemma4rt::serve
