// Tokenizer tests: the Gemma-4-style goldens (produced with Hugging Face's tokenizers), the tiny models'
// coherence prompts, streaming detokenization, hand-built files for the less common features, and
// errors for broken files.
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace gemma4rt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kTestData = GEMMA4RT_TEST_DATA;
const fs::path kModels = GEMMA4RT_MODELS;
const fs::path kTestWork = GEMMA4RT_TEST_WORK;
const std::vector<std::string> kModelNames = {"tiny-e2b", "tiny-e4b",     "tiny-12b",
                                              "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"};

json read_json(const fs::path& path) {
  std::ifstream stream(path);
  if (!stream) throw std::runtime_error("cannot open " + path.string());
  return json::parse(stream);
}

// Loading the 262,144-entry tokenizer takes a noticeable fraction of a second: do it once per process.
const Tokenizer& gemma4_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(kTestWork / "gemma4-tokenizer.json");
  return tokenizer;
}

// Readable form of test text for failure messages: control characters escaped, long text shortened.
std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char c : text.substr(0, 160)) {
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > 160) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  if (ids.size() <= 40) return fmt::format("[{}]", fmt::join(ids, ", "));
  return fmt::format("[{}, ... ({} ids)]", fmt::join(ids.begin(), ids.begin() + 40, ", "), ids.size());
}

// Strict UTF-8 validity, written independently of the tokenizer's own check.
bool valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t extra;
    char32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      extra = 1;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      extra = 2;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      extra = 3;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const char32_t minimum[] = {0, 0x80, 0x800, 0x10000};
    if (cp < minimum[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

std::vector<int32_t> ids_of(const json& array) { return array.get<std::vector<int32_t>>(); }

// Streams `ids` one at a time and checks that every chunk is valid UTF-8 and that all chunks together
// equal the one-shot decode. Returns an empty string on success, else a description of the problem.
std::string check_streaming(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  StreamingDecoder decoder(tokenizer, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = decoder.push(ids[i]);
    if (!valid_utf8(chunk))
      return fmt::format("push #{} (id {}) returned invalid UTF-8 \"{}\"", i, ids[i], printable(chunk));
    streamed += chunk;
  }
  const std::string rest = decoder.finish();
  if (!valid_utf8(rest)) return fmt::format("finish() returned invalid UTF-8 \"{}\"", printable(rest));
  streamed += rest;
  const std::string expected = tokenizer.decode(ids, skip_special);
  if (streamed != expected) {
    return fmt::format("streamed \"{}\" but decode gives \"{}\"", printable(streamed), printable(expected));
  }
  return {};
}

std::string load_error(const fs::path& path) {
  try {
    Tokenizer::load(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error thrown)";
}

fs::path write_file(const std::string& name, const std::string& contents) {
  const fs::path path = kTestWork / name;
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

fs::path write_json(const std::string& name, const json& contents) { return write_file(name, contents.dump(1)); }

// ---------------------------------------------------------------------------------------------------
// Gemma-4-style tokenizer against the Hugging Face goldens

TEST(TokenizerGoldenTest, EncodeMatchesEveryGoldenCase) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  const json golden = read_json(kTestData / "tokenizer/golden-encode.json");
  ASSERT_EQ(golden["cases"].size(), 452u);
  int failures = 0;
  for (const json& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> expected = ids_of(c["ids"]);
    const std::vector<int32_t> actual = tokenizer.encode(text);
    if (actual != expected) {
      ++failures;
      ADD_FAILURE() << "encode mismatch in category " << c["category"].get<std::string>() << " for text \""
                    << printable(text) << "\"\n  expected " << ids_text(expected) << "\n  actual   "
                    << ids_text(actual);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerGoldenTest, DecodeOfEveryEncodeGoldenMatches) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  const json golden = read_json(kTestData / "tokenizer/golden-encode.json");
  int literal_block_cases = 0;
  for (const json& c : golden["cases"]) {
    const std::string expected = c["decoded"].get<std::string>();
    const std::string actual = tokenizer.decode(ids_of(c["ids"]));
    EXPECT_EQ(actual, expected) << "decode mismatch in category " << c["category"].get<std::string>()
                                << " for text \"" << printable(c["text"].get<std::string>()) << "\"";
    if (expected != c["text"].get<std::string>()) ++literal_block_cases;
  }
  // Only a "▁" typed in the input fails to round-trip: it decodes to a space.
  EXPECT_EQ(literal_block_cases, 9);
}

TEST(TokenizerGoldenTest, DecodeGoldensMatchWithAndWithoutSpecialTokens) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  const json golden = read_json(kTestData / "tokenizer/golden-decode.json");
  ASSERT_EQ(golden["cases"].size(), 116u);
  for (const json& c : golden["cases"]) {
    const bool skip = c["skip_special_tokens"].get<bool>();
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tokenizer.decode(ids, skip), c["decoded"].get<std::string>())
        << "case \"" << c["note"].get<std::string>() << "\" with skip_special_tokens=" << skip << ", ids "
        << ids_text(ids);
  }
}

TEST(TokenizerGoldenTest, VocabularyLookupsAndSpecialTokens) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), 262144);
  EXPECT_EQ(tokenizer.token_id("<bos>"), 2);
  EXPECT_EQ(tokenizer.token_id("<turn|>"), 106);
  EXPECT_EQ(tokenizer.token_id("<|turn>"), 105);
  EXPECT_EQ(tokenizer.token_id("<0x0A>"), 248);
  EXPECT_EQ(tokenizer.token_id("<0xFF>"), 493);
  EXPECT_EQ(tokenizer.token_id("\n"), 107);
  EXPECT_FALSE(tokenizer.token_id("<start_of_turn>").has_value());  // renamed in the Gemma 4 file
  EXPECT_FALSE(tokenizer.token_id("").has_value());
  EXPECT_EQ(tokenizer.token_text(106), "<turn|>");
  EXPECT_EQ(tokenizer.token_text(248), "<0x0A>");
  EXPECT_EQ(tokenizer.token_text(258884), "<|video|>");
  EXPECT_THROW(tokenizer.token_text(262144), Error);
  EXPECT_THROW(tokenizer.token_text(-1), Error);

  const std::vector<int32_t> specials = {0,      1,      2,      3,      46,     47,     48,    49,
                                         50,     51,     52,     98,     100,    101,    105,   106,
                                         255999, 256000, 258880, 258881, 258882, 258883, 258884};
  int special_count = 0;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) special_count += tokenizer.is_special(id) ? 1 : 0;
  EXPECT_EQ(special_count, static_cast<int>(specials.size()));
  for (int32_t id : specials) EXPECT_TRUE(tokenizer.is_special(id)) << "id " << id;
  EXPECT_FALSE(tokenizer.is_special(4));    // <mask>: added but not special
  EXPECT_FALSE(tokenizer.is_special(107));  // "\n"
  EXPECT_FALSE(tokenizer.is_special(-5));
  EXPECT_FALSE(tokenizer.is_special(1 << 30));

  // TemplateProcessing with "$A" alone: plain encoding adds nothing.
  EXPECT_TRUE(tokenizer.post_processor_added_prefix().empty());
  EXPECT_TRUE(tokenizer.post_processor_added_suffix().empty());
  EXPECT_EQ(tokenizer.encode("<bos>"), std::vector<int32_t>{2});
  EXPECT_TRUE(tokenizer.encode("").empty());
}

TEST(TokenizerGoldenTest, InvalidUtf8InputBecomesByteTokens) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  const auto byte_id = [](int byte) { return 238 + byte; };  // checked by VocabularyLookupsAndSpecialTokens
  // A stray continuation byte, a truncated 3-byte sequence, an overlong "/" and an encoded surrogate.
  std::vector<int32_t> expected = {byte_id(0xFF)};
  const std::vector<int32_t> hello = tokenizer.encode("Hello");
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(byte_id(0x80));
  expected.push_back(byte_id(0xE4));
  expected.push_back(byte_id(0xB8));
  expected.push_back(byte_id(0xC0));
  expected.push_back(byte_id(0xAF));
  expected.push_back(byte_id(0xED));
  expected.push_back(byte_id(0xA0));
  expected.push_back(byte_id(0x80));
  const std::string text = "\xFFHello\x80\xE4\xB8\xC0\xAF\xED\xA0\x80";
  EXPECT_EQ(tokenizer.encode(text), expected);
  // One run of 8 invalid bytes: 8 replacement characters.
  std::string replaced = "\xEF\xBF\xBD";
  for (int i = 0; i < 7; ++i) replaced += "\xEF\xBF\xBD";
  EXPECT_EQ(tokenizer.decode(expected),
            "\xEF\xBF\xBD"
            "Hello" +
                replaced);
  // Invalid bytes around an added token do not disturb its matching.
  EXPECT_EQ(tokenizer.encode("\xC3<turn|>\xC3"), (std::vector<int32_t>{byte_id(0xC3), 106, byte_id(0xC3)}));
}

TEST(TokenizerGoldenTest, LongInputEncodesQuicklyAndRoundTrips) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  // One BPE word of 400 KB (no spaces survive normalization, no added tokens): a merge loop that rescans
  // all pairs after each merge would take minutes here.
  std::string text;
  const std::string paragraph =
      "Tokenizers split text into pieces; the quick brown fox jumps over the lazy dog 1234567890 times, "
      "café naïve Ωμέγα 東京 🙂 — and then some more words to make the paragraph longer. ";
  while (text.size() < 400'000) text += paragraph;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("encode_400kb_seconds", fmt::format("{:.3f}", seconds));
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_EQ(tokenizer.decode(ids), text);
  // Encoding is context-free across repeated paragraphs only at word starts, so just check a prefix too.
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(paragraph)), paragraph);
}

// ---------------------------------------------------------------------------------------------------
// The tiny models' tokenizers and coherence prompts

TEST(TokenizerModelsTest, CoherencePromptsEncodeAndDecodeExactly) {
  for (const std::string& model : kModelNames) {
    SCOPED_TRACE("model " + model);
    const Tokenizer tokenizer = Tokenizer::load(kModels / model / "tokenizer.json");
    EXPECT_EQ(tokenizer.vocab_size(), 1024);
    const json coherence = read_json(kModels / model / "coherence.json");
    ASSERT_FALSE(coherence["prompts"].empty());
    for (const json& prompt : coherence["prompts"]) {
      const std::string id = prompt["id"].get<std::string>();
      const std::vector<int32_t> input_ids = ids_of(prompt["input_ids"]);
      EXPECT_EQ(tokenizer.encode(prompt["text"].get<std::string>()), input_ids) << "prompt " << id;
      const std::vector<int32_t> output_ids = ids_of(prompt["output_ids"]);
      EXPECT_EQ(tokenizer.decode(output_ids, true), prompt["output_text"].get<std::string>()) << "prompt " << id;
      if (prompt.contains("output_text_with_special_tokens")) {
        EXPECT_EQ(tokenizer.decode(output_ids, false), prompt["output_text_with_special_tokens"].get<std::string>())
            << "prompt " << id;
      } else {
        EXPECT_NE(model, "tiny-e2b-agent") << "prompt " << id << " lacks output_text_with_special_tokens";
      }
    }
  }
}

TEST(TokenizerModelsTest, NonAsciiLettersGoThroughByteFallback) {
  const Tokenizer tokenizer = Tokenizer::load(kModels / "tiny-e2b/tokenizer.json");
  const auto bogot = tokenizer.token_id("▁Bogot");
  const auto c3 = tokenizer.token_id("<0xC3>");
  const auto a1 = tokenizer.token_id("<0xA1>");
  ASSERT_TRUE(bogot && c3 && a1);
  EXPECT_EQ(*c3, 108 + 0xC3);
  const std::vector<int32_t> ids = {*bogot, *c3, *a1};
  EXPECT_EQ(tokenizer.decode(ids), " Bogotá");
  EXPECT_EQ(tokenizer.encode(" Bogotá"), ids);
  EXPECT_TRUE(tokenizer.is_special(106));
  EXPECT_FALSE(tokenizer.is_special(107));
  EXPECT_TRUE(tokenizer.post_processor_added_prefix().empty());
}

// ---------------------------------------------------------------------------------------------------
// Streaming detokenization

TEST(StreamingDecoderTest, MatchesOneShotDecodeOnGoldens) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> everything;
  const json encode_cases = read_json(kTestData / "tokenizer/golden-encode.json");  // kept alive for the loop
  for (const json& c : encode_cases["cases"]) {
    sequences.push_back(ids_of(c["ids"]));
    everything.insert(everything.end(), sequences.back().begin(), sequences.back().end());
  }
  const json decode_cases = read_json(kTestData / "tokenizer/golden-decode.json");
  for (const json& c : decode_cases["cases"]) {
    sequences.push_back(ids_of(c["ids"]));
    everything.insert(everything.end(), sequences.back().begin(), sequences.back().end());
  }
  sequences.push_back(everything);
  for (const auto& ids : sequences) {
    for (bool skip : {false, true}) {
      EXPECT_EQ(check_streaming(tokenizer, ids, skip), "") << "ids " << ids_text(ids) << ", skip=" << skip;
    }
  }
}

TEST(StreamingDecoderTest, MatchesOneShotDecodeOnRandomIdsWithManyByteTokens) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  std::mt19937 random(20240611);
  std::uniform_int_distribution<int32_t> any_id(0, tokenizer.vocab_size() - 1);
  std::uniform_int_distribution<int32_t> byte_id(238, 493);
  std::uniform_int_distribution<int32_t> special_id(0, 6);
  const int32_t specials[] = {1, 2, 105, 106, 100, 101, 52};
  const int32_t utf8_lead_and_continuation[] = {238 + 0xE4, 238 + 0xB8, 238 + 0xAD, 238 + 0xC3, 238 + 0xA9,
                                                238 + 0xF0, 238 + 0x9F, 238 + 0x99, 238 + 0x82, 238 + 0x41};
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int> pick10(0, 9);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids(1 + round % 40);
    for (int32_t& id : ids) {
      const int k = kind(random);
      id = k < 3   ? any_id(random)
           : k < 5 ? byte_id(random)
           : k < 6 ? specials[special_id(random)]
                   : utf8_lead_and_continuation[pick10(random)];
    }
    for (bool skip : {false, true}) {
      EXPECT_EQ(check_streaming(tokenizer, ids, skip), "") << "ids " << ids_text(ids) << ", skip=" << skip;
    }
  }
}

TEST(StreamingDecoderTest, MatchesOneShotDecodeOnModelOutputs) {
  for (const std::string& model : kModelNames) {
    SCOPED_TRACE("model " + model);
    const Tokenizer tokenizer = Tokenizer::load(kModels / model / "tokenizer.json");
    const json fixture = read_json(kModels / model / "coherence.json");
    for (const json& prompt : fixture["prompts"]) {
      for (const char* field : {"input_ids", "output_ids"}) {
        const std::vector<int32_t> ids = ids_of(prompt[field]);
        for (bool skip : {false, true}) {
          EXPECT_EQ(check_streaming(tokenizer, ids, skip), "")
              << "prompt " << prompt["id"].get<std::string>() << " " << field << ", skip=" << skip;
        }
      }
      // The streamed output is exactly what the coherence file expects.
      StreamingDecoder decoder(tokenizer);
      std::string streamed;
      for (int32_t id : ids_of(prompt["output_ids"])) streamed += decoder.push(id);
      streamed += decoder.finish();
      EXPECT_EQ(streamed, prompt["output_text"].get<std::string>());
    }
  }
}

TEST(StreamingDecoderTest, HoldsByteRunsBackUntilTheyEnd) {
  const Tokenizer& tokenizer = gemma4_tokenizer();
  const int32_t b = 238;  // id of <0x00>
  const int32_t hello = tokenizer.encode("Hello")[0];
  ASSERT_EQ(tokenizer.encode("Hello").size(), 1u);
  {
    // 中 arrives over three pushes and comes out whole when the next token ends the run.
    StreamingDecoder decoder(tokenizer);
    EXPECT_EQ(decoder.push(b + 0xE4), "");
    EXPECT_EQ(decoder.push(b + 0xB8), "");
    EXPECT_EQ(decoder.push(b + 0xAD), "");
    EXPECT_EQ(decoder.push(hello), "中Hello");
    EXPECT_EQ(decoder.finish(), "");
  }
  {
    // "A" looks complete, but the run turns invalid: one U+FFFD per byte of the whole run.
    StreamingDecoder decoder(tokenizer);
    EXPECT_EQ(decoder.push(b + 0x41), "");
    EXPECT_EQ(decoder.push(b + 0xFF), "");
    EXPECT_EQ(decoder.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
    // finish() resets the decoder.
    EXPECT_EQ(decoder.push(hello), "Hello");
    EXPECT_EQ(decoder.finish(), "");
  }
  {
    // A skipped special token does not end the run; a kept one does.
    StreamingDecoder skipping(tokenizer, true);
    EXPECT_EQ(skipping.push(b + 0xC3), "");
    EXPECT_EQ(skipping.push(106), "");
    EXPECT_EQ(skipping.push(b + 0xA9), "");
    EXPECT_EQ(skipping.finish(), "é");
    StreamingDecoder keeping(tokenizer, false);
    EXPECT_EQ(keeping.push(b + 0xC3), "");
    EXPECT_EQ(keeping.push(106), "\xEF\xBF\xBD<turn|>");
    EXPECT_EQ(keeping.push(b + 0xA9), "");
    EXPECT_EQ(keeping.finish(), "\xEF\xBF\xBD");
  }
  {
    // Ordinary tokens come out immediately, with "▁" turned into a space.
    StreamingDecoder decoder(tokenizer);
    std::string streamed;
    for (int32_t id : tokenizer.encode("The capital of France is Paris.")) {
      const std::string chunk = decoder.push(id);
      EXPECT_FALSE(chunk.empty());
      streamed += chunk;
    }
    EXPECT_EQ(streamed, "The capital of France is Paris.");
    EXPECT_EQ(decoder.finish(), "");
  }
}

// ---------------------------------------------------------------------------------------------------
// Hand-built files for features the Gemma files do not use

json minimal_bpe(json vocab, json merges) {
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", {{"type", "Fuse"}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"fuse_unk", true},
                {"byte_fallback", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}}}};
}

json added_token(const std::string& content, int id, bool special, bool normalized = false) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

const json kSmallVocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}};

TEST(TokenizerSyntheticTest, UnknownCharactersBecomeUnkFusedOrNot) {
  json file = minimal_bpe(kSmallVocab, json::array({json::array({"a", "b"})}));
  const Tokenizer fused = Tokenizer::load(write_json("synthetic/unk-fused.json", file));
  EXPECT_EQ(fused.encode("abxyab"), (std::vector<int32_t>{3, 0, 3}));
  EXPECT_EQ(fused.decode(std::vector<int32_t>{3, 0, 3}), "ab<unk>ab");

  file["model"]["fuse_unk"] = false;
  const Tokenizer separate = Tokenizer::load(write_json("synthetic/unk-separate.json", file));
  EXPECT_EQ(separate.encode("abxyab"), (std::vector<int32_t>{3, 0, 0, 3}));

  // Merges written as "left right" strings (older files) mean the same.
  file["model"]["merges"] = json::array({"a b"});
  const Tokenizer string_merges = Tokenizer::load(write_json("synthetic/string-merges.json", file));
  EXPECT_EQ(string_merges.encode("abxyab"), (std::vector<int32_t>{3, 0, 0, 3}));

  // Without a decoder the tokens are joined with spaces.
  file["decoder"] = nullptr;
  const Tokenizer no_decoder = Tokenizer::load(write_json("synthetic/no-decoder.json", file));
  const std::vector<int32_t> ids = {3, 0, 1};
  EXPECT_EQ(no_decoder.decode(ids), "ab <unk> a");
  EXPECT_EQ(check_streaming(no_decoder, ids, false), "");
}

TEST(TokenizerSyntheticTest, NormalizedAddedTokenIsMatchedAfterNormalization) {
  json file = minimal_bpe(kSmallVocab, json::array({json::array({"a", "b"})}));
  file["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}};
  file["added_tokens"] = json::array({added_token("x y", 4, false, /*normalized=*/true)});
  const Tokenizer tokenizer = Tokenizer::load(write_json("synthetic/normalized-added.json", file));
  const std::vector<int32_t> ids = {1, 4, 2};
  EXPECT_EQ(tokenizer.vocab_size(), 5);
  EXPECT_EQ(tokenizer.token_id("x y"), 4);
  EXPECT_FALSE(tokenizer.token_id("x_y").has_value());
  EXPECT_FALSE(tokenizer.is_special(4));
  EXPECT_EQ(tokenizer.encode("ax yb"), ids);
  EXPECT_EQ(tokenizer.encode("ax_yb"), ids);  // matching happens in the normalized text
  // The Rust library decodes such a token from its normalized form, leaving the decoder to undo the
  // normalizer; this decoder (Fuse alone) does not.
  EXPECT_EQ(tokenizer.token_text(4), "x_y");
  EXPECT_EQ(tokenizer.decode(ids), "ax_yb");

  file["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "Replace"}, {"pattern", {{"String", "_"}}}, {"content", " "}}, {{"type", "Fuse"}}})}};
  const Tokenizer undoing = Tokenizer::load(write_json("synthetic/normalized-added-undone.json", file));
  EXPECT_EQ(undoing.decode(ids), "ax yb");
  EXPECT_EQ(check_streaming(undoing, ids, false), "");
}

TEST(TokenizerSyntheticTest, SplitPreTokenizerBehaviors) {
  // " b" has the lowest rank, so without pre-tokenization "a b" becomes a, " b".
  const json vocab = {{"<unk>", 5}, {"a", 0}, {"b", 1}, {" ", 2}, {"a ", 3}, {" b", 4}};
  const json merges = json::array({json::array({" ", "b"}), json::array({"a", " "})});
  json file = minimal_bpe(vocab, merges);
  const auto encode_with = [&](const json& pre_tokenizer, const std::string& text) {
    file["pre_tokenizer"] = pre_tokenizer;
    return Tokenizer::load(write_json("synthetic/split.json", file)).encode(text);
  };
  const auto split = [](const char* behavior) {
    return json{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", behavior}, {"invert", false}};
  };
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(encode_with(nullptr, "a b"), (Ids{0, 4}));
  EXPECT_EQ(encode_with(split("MergedWithPrevious"), "a b"), (Ids{3, 1}));
  EXPECT_EQ(encode_with(split("MergedWithPrevious"), "a  b"), (Ids{3, 2, 1}));
  EXPECT_EQ(encode_with(split("MergedWithNext"), "a b"), (Ids{0, 4}));
  EXPECT_EQ(encode_with(split("MergedWithNext"), "a  b"), (Ids{0, 2, 4}));
  EXPECT_EQ(encode_with(split("Removed"), "a b"), (Ids{0, 1}));
  EXPECT_EQ(encode_with(split("Isolated"), "a b"), (Ids{0, 2, 1}));
  EXPECT_EQ(encode_with(split("Contiguous"), "a  b"), (Ids{0, 2, 2, 1}));
  const json sequence = {{"type", "Sequence"}, {"pretokenizers", json::array({split("Isolated")})}};
  EXPECT_EQ(encode_with(sequence, "a b"), (Ids{0, 2, 1}));
}

// A Llama-style file: Prepend "▁" normalizer, byte fallback, Strip after Fuse, and a post-processor that
// adds <s>.
json llama_style_file(int strip_start, int strip_stop) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"▁", 2}, {"h", 3}, {"i", 4}, {"▁h", 5}, {"▁hi", 6}};
  for (int byte : {0x21, 0xC3, 0xA9}) vocab[fmt::format("<0x{:02X}>", byte)] = static_cast<int>(vocab.size());
  json file = minimal_bpe(vocab, json::array({json::array({"▁", "h"}), json::array({"▁h", "i"})}));
  file["model"]["byte_fallback"] = true;
  file["added_tokens"] = json::array({added_token("<s>", 1, true)});
  file["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                                   {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}};
  file["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", strip_start}, {"stop", strip_stop}}})}};
  file["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                            {"pair", json::array()},
                            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  return file;
}

TEST(TokenizerSyntheticTest, PrependNormalizerStripDecoderAndTemplatePrefix) {
  const Tokenizer tokenizer = Tokenizer::load(write_json("synthetic/llama-style.json", llama_style_file(1, 0)));
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(tokenizer.encode("hi hi"), (Ids{6, 6}));
  EXPECT_EQ(tokenizer.encode("hi!"), (Ids{6, 7}));    // "!" only as a byte token
  EXPECT_EQ(tokenizer.encode("<s>hi"), (Ids{1, 6}));  // Prepend applies to the text after <s>
  EXPECT_EQ(tokenizer.encode("hé"), (Ids{5, 8, 9}));
  // "<" has neither a token nor a byte token: <unk>. As in the Rust library, a pending <unk> is not
  // flushed by byte-fallback tokens, so it comes after them and the second "<" fuses into it.
  EXPECT_EQ(tokenizer.encode("<é<"), (Ids{2, 8, 9, 0}));
  EXPECT_EQ(tokenizer.encode("<hi"), (Ids{2, 0, 3, 4}));
  EXPECT_EQ(tokenizer.decode(Ids{6, 6}), "hi hi");  // Strip removes the one leading space
  EXPECT_EQ(tokenizer.decode(Ids{2, 2, 6}), "  hi");
  EXPECT_EQ(tokenizer.decode(Ids{1, 6}, false), "<s> hi");
  EXPECT_EQ(tokenizer.decode(Ids{1, 6}, true), "hi");
  EXPECT_EQ(tokenizer.post_processor_added_prefix(), (Ids{1}));
  EXPECT_TRUE(tokenizer.post_processor_added_suffix().empty());
  for (const Ids& ids : {Ids{2, 8, 9, 6}, Ids{1, 2, 6}, Ids{2, 2, 6, 2}, Ids{8, 1, 9}, Ids{2}, Ids{}}) {
    for (bool skip : {false, true}) EXPECT_EQ(check_streaming(tokenizer, ids, skip), "") << ids_text(ids);
  }

  // Strip at the end as well: trailing spaces are held back while streaming until more text follows.
  const Tokenizer both_ends =
      Tokenizer::load(write_json("synthetic/llama-style-strip-both.json", llama_style_file(1, 1)));
  EXPECT_EQ(both_ends.decode(Ids{6, 2, 2}), "hi ");
  StreamingDecoder decoder(both_ends);
  EXPECT_EQ(decoder.push(6), "hi");
  EXPECT_EQ(decoder.push(2), "");
  EXPECT_EQ(decoder.push(2), "");
  EXPECT_EQ(decoder.finish(), " ");
  for (const Ids& ids : {Ids{6, 2, 2}, Ids{2, 2, 6, 2, 6}, Ids{2}, Ids{2, 2}, Ids{2, 2, 2}, Ids{2, 8, 2}}) {
    for (bool skip : {false, true}) EXPECT_EQ(check_streaming(both_ends, ids, skip), "") << ids_text(ids);
  }
}

TEST(TokenizerSyntheticTest, AddedTokenLstripAndRstripConsumeWhitespace) {
  const json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"▁", 3}, {"<m>", 4}};
  json file = minimal_bpe(vocab, json::array());
  file["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}};
  json token = added_token("<m>", 4, true);
  file["added_tokens"] = json::array({token});
  EXPECT_EQ(Tokenizer::load(write_json("synthetic/plain-added.json", file)).encode("a <m> b"),
            (std::vector<int32_t>{1, 3, 4, 3, 2}));
  token["lstrip"] = true;
  token["rstrip"] = true;
  file["added_tokens"] = json::array({token});
  EXPECT_EQ(Tokenizer::load(write_json("synthetic/stripping-added.json", file)).encode("a \t<m>\u3000 b"),
            (std::vector<int32_t>{1, 4, 2}));
}

// ---------------------------------------------------------------------------------------------------
// Broken files

json tiny_tokenizer_json() { return read_json(kModels / "tiny-e2b/tokenizer.json"); }

TEST(TokenizerErrorsTest, MissingFileNamesTheFile) {
  const std::string message = load_error(kTestWork / "no-such-tokenizer.json");
  EXPECT_NE(message.find("no-such-tokenizer.json"), std::string::npos) << message;
}

TEST(TokenizerErrorsTest, UnsupportedModelTypeNamesFileAndField) {
  json file = tiny_tokenizer_json();
  file["model"]["type"] = "WordPiece";
  const std::string message = load_error(write_json("broken/wordpiece-tokenizer.json", file));
  EXPECT_NE(message.find("wordpiece-tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("model.type \"WordPiece\" is not supported"), std::string::npos) << message;
}

TEST(TokenizerErrorsTest, UnsupportedComponentsNameTheirField) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"nfkc",
       [](json& f) {
         f["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer.type \"NFKC\" is not supported"},
      {"nested-lowercase",
       [](json& f) {
         f["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", json::array({f["normalizer"], {{"type", "Lowercase"}}})}};
       },
       "normalizer.normalizers[1].type \"Lowercase\" is not supported"},
      {"bytelevel",
       [](json& f) {
         f["pre_tokenizer"] = {{"type", "ByteLevel"}};
       },
       "pre_tokenizer.type \"ByteLevel\" is not supported"},
      {"regex-split",
       [](json& f) {
         f["pre_tokenizer"]["pattern"] = {{"Regex", "\\s+"}};
       },
       "pre_tokenizer.pattern: Regex patterns are not supported"},
      {"metaspace-decoder",
       [](json& f) {
         f["decoder"]["decoders"][1] = {{"type", "Metaspace"}};
       },
       "decoder.decoders[1].type \"Metaspace\" is not supported"},
      {"replace-after-fuse", [](json& f) { f["decoder"]["decoders"].push_back(f["decoder"]["decoders"][0]); },
       "after Fuse is not supported"},
      {"post-processor",
       [](json& f) {
         f["post_processor"] = {{"type", "Mystery"}};
       },
       "post_processor.type \"Mystery\" is not supported"},
      {"missing-vocab", [](json& f) { f["model"].erase("vocab"); }, "\"model.vocab\" is missing"},
      {"missing-model", [](json& f) { f.erase("model"); }, "\"model\" is missing"},
      {"dropout", [](json& f) { f["model"]["dropout"] = 0.1; }, "model.dropout is not supported"},
      {"single-word", [](json& f) { f["added_tokens"][0]["single_word"] = true; },
       "added_tokens[0].single_word true is not supported"},
      {"bad-merge",
       [](json& f) {
         f["model"]["merges"].push_back(json::array({"zzz", "a"}));
       },
       "\"zzz\" is not in model.vocab"},
      {"bad-vocab-entry", [](json& f) { f["model"]["vocab"]["oops"] = "seven"; }, "model.vocab must map"},
      {"unk-missing", [](json& f) { f["model"]["unk_token"] = "<nope>"; }, "model.unk_token \"<nope>\""},
  };
  for (const Case& c : cases) {
    json file = tiny_tokenizer_json();
    c.edit(file);
    const std::string name = fmt::format("broken/{}-tokenizer.json", c.name);
    const std::string message = load_error(write_json(name, file));
    EXPECT_NE(message.find(fmt::format("{}-tokenizer.json", c.name)), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << "case " << c.name << ": " << message;
  }
}

TEST(TokenizerErrorsTest, InvalidJsonNamesTheFile) {
  const std::string text = tiny_tokenizer_json().dump();
  const std::string message =
      load_error(write_file("broken/truncated-tokenizer.json", text.substr(0, text.size() / 2)));
  EXPECT_NE(message.find("truncated-tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not a valid tokenizer.json"), std::string::npos) << message;
}

}  // namespace
}  // namespace gemma4rt
