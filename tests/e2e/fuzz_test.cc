// Bounded, seeded fuzzing of what gemma4rt reads from disk: mutated config.json, safetensors headers
// and tokenizer.json of a small checkpoint. Every run must either work or end with one
// "gemma4rt: error: ..." line and status 1: never a signal, an internal error (status 2) or a hang.
// The seed and mutation of a failing case are printed, so it can be replayed.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_support.h"

namespace gemma4rt::testing {
namespace {

constexpr int kCases = 40;
const std::filesystem::path kSource = std::filesystem::path(GEMMA4RT_MODELS) / "tiny-e2b";

// JSON values a careless or hostile writer might put anywhere.
const std::vector<std::string> kOddValues = {
    "1e999", "-1", "18446744073709551616", "-9223372036854775809", "\"x\"", "[]", "{}", "null", "true", "0", "0.5", "\"\"",
    "\"\\ud800\"", "[1,2,3]", std::string(5000, '[') + std::string(5000, ']'), "{\"a\":" + std::string(300, '[') + std::string(300, ']') + "}",
};

// One mutation of a JSON text, described for the failure message.
std::string mutate(const std::string& text, std::mt19937& random, std::string& what) {
  std::string out = text;
  auto position = [&](size_t size) { return std::uniform_int_distribution<size_t>(0, size == 0 ? 0 : size - 1)(random); };
  switch (std::uniform_int_distribution<int>(0, 4)(random)) {
    case 0: {  // a value replaced: find a digit, a quote or a bracket and swap the token there
      size_t at = position(out.size());
      while (at < out.size() && std::string("0123456789\"[{tfn").find(out[at]) == std::string::npos) ++at;
      if (at >= out.size()) at = 0;
      size_t end = at + 1;
      if (out[at] == '"') {
        end = out.find('"', at + 1);
        end = end == std::string::npos ? out.size() : end + 1;
      } else {
        while (end < out.size() && std::string(",}] \n").find(out[end]) == std::string::npos) ++end;
      }
      const std::string& value = kOddValues[position(kOddValues.size())];
      what = fmt::format("bytes [{}, {}) replaced by {}", at, end, value.substr(0, 40));
      out.replace(at, end - at, value);
      break;
    }
    case 1: {  // a byte flipped, often into invalid UTF-8
      const size_t at = position(out.size());
      const char byte = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(random));
      what = fmt::format("byte {} set to 0x{:02x}", at, static_cast<unsigned char>(byte));
      if (!out.empty()) out[at] = byte;
      break;
    }
    case 2: {  // cut short
      const size_t at = position(out.size());
      what = fmt::format("truncated to {} bytes", at);
      out.resize(at);
      break;
    }
    case 3: {  // a slice repeated (duplicate keys, unbalanced brackets)
      const size_t at = position(out.size());
      const size_t length = std::min<size_t>(out.size() - at, std::uniform_int_distribution<size_t>(1, 64)(random));
      what = fmt::format("bytes [{}, {}) repeated", at, at + length);
      out.insert(at, out.substr(at, length));
      break;
    }
    default: {  // a bracket removed
      size_t at = out.find_first_of("[{", position(out.size()));
      if (at == std::string::npos) at = out.find_first_of("[{");
      what = fmt::format("bracket at {} removed", at);
      if (at != std::string::npos) out.erase(at, 1);
      break;
    }
  }
  return out;
}

// Returns whether the run was refused (status 1) rather than run.
bool expect_clean(const std::filesystem::path& dir, const std::vector<std::string>& prompt, const std::string& label) {
  std::vector<std::string> arguments = {"run", "--model", dir.string(), "--max-tokens", "1", "--threads", "1"};
  arguments.insert(arguments.end(), prompt.begin(), prompt.end());
  const CommandResult result = run_gemma4rt(arguments);
  EXPECT_TRUE(result.exit_code == 0 || result.exit_code == 1) << label << ": exit " << result.exit_code << "\n" << result.err;
  if (result.exit_code == 1) {
    EXPECT_TRUE(result.err.starts_with("gemma4rt: error: ")) << label << ": " << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << label << ": " << result.err;
  }
  return result.exit_code == 1;
}

// The mutations must reach the loaders: most of them are refused, and the unmutated file runs.
void expect_mostly_refused(int refused, const std::filesystem::path& dir, const std::vector<std::string>& prompt) {
  EXPECT_GE(refused, kCases / 3) << "only " << refused << " of " << kCases << " mutations were refused";
  copy_checkpoint(kSource, dir);
  EXPECT_FALSE(expect_clean(dir, prompt, "the original files"));
}

// kCases mutations of the text file `name` of the source checkpoint (seeds from `first_seed`), each run
// with `prompt`: a clean result every time, most of them refused.
void fuzz_text_file(const std::string& name, uint32_t first_seed, const std::vector<std::string>& prompt) {
  const std::string original = read_text_file(kSource / name);
  const auto dir = fresh_work_dir("fuzz/" + name);
  copy_checkpoint(kSource, dir);
  int refused = 0;
  for (int seed = 0; seed < kCases; ++seed) {
    std::mt19937 random(first_seed + static_cast<uint32_t>(seed));
    std::string what;
    write_text_file(dir / name, mutate(original, random, what));
    refused += expect_clean(dir, prompt, fmt::format("{} seed {}: {}", name, seed, what));
  }
  expect_mostly_refused(refused, dir, prompt);
}

TEST(Fuzz, ConfigJson) { fuzz_text_file("config.json", 0, {"--prompt-ids", "2,17"}); }

TEST(Fuzz, SafetensorsHeader) {
  const std::string original = read_text_file(kSource / "model.safetensors");
  uint64_t header_size = 0;
  std::memcpy(&header_size, original.data(), 8);
  const std::string header = original.substr(8, header_size), data = original.substr(8 + header_size);
  const auto dir = fresh_work_dir("fuzz/safetensors");
  copy_checkpoint(kSource, dir);
  int refused = 0;
  for (int seed = 0; seed < kCases; ++seed) {
    std::mt19937 random(static_cast<uint32_t>(1000 + seed));
    std::string what;
    std::string mutated = mutate(header, random, what);
    if (seed % 2 == 0) mutated.append((8 - mutated.size() % 8) % 8, ' ');  // half of them keep the data aligned
    uint64_t length = mutated.size();
    if (seed % 7 == 3) {
      length += std::uniform_int_distribution<uint64_t>(0, 1ull << 40)(random);  // a length field that lies
      what += ", header length field wrong";
    }
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &length, 8);
    write_text_file(dir / "model.safetensors", bytes + mutated + data);
    refused += expect_clean(dir, {"--prompt-ids", "2,17"}, fmt::format("model.safetensors seed {}: {}", seed, what));
  }
  expect_mostly_refused(refused, dir, {"--prompt-ids", "2,17"});
}

TEST(Fuzz, TokenizerJson) { fuzz_text_file("tokenizer.json", 2000, {"--chat", "What is the capital of France?"}); }

}  // namespace
}  // namespace gemma4rt::testing
