// Hugging Face `tokenizer.json` tokenizer (BPE model), written to reproduce what the Rust `tokenizers`
// library does for Gemma-style files:
//   encode: added tokens are cut out of the raw text first (leftmost-longest), every stretch in between is
//           normalized, pre-tokenized and run through byte-fallback BPE; the post-processor is not applied.
//   decode: the decoder chain (Replace, ByteFallback, Fuse, Strip) runs over the tokens' raw pieces.
// Anything in the file that this code cannot reproduce exactly is rejected at load time with an Error that
// names the file and the field, rather than silently tokenizing differently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gemma4rt {

class Tokenizer {
 public:
  // Throws gemma4rt::Error naming the file and the field that is missing or unsupported.
  static Tokenizer load(const std::filesystem::path& tokenizer_json);

  // Token ids for the text, without BOS/EOS or anything else a post-processor would add.
  // Invalid UTF-8 does not throw: each byte that is not part of a well-formed sequence becomes its
  // byte-fallback token (or <unk> when the model has no byte fallback).
  std::vector<int32_t> encode(std::string_view utf8_text) const;

  // Text for the ids. skip_special_tokens drops added tokens marked `special: true` (before byte-fallback
  // runs are joined, as the Rust library does). Ids without a token are dropped, as the Rust library does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Number of ids: one more than the largest id of the vocabulary or the added tokens.
  int32_t vocab_size() const;

  // Exact lookup of a vocabulary entry or added-token string (no normalization).
  std::optional<int32_t> token_id(std::string_view token) const;

  // The raw piece of an id, e.g. "▁Paris", "<0x0A>", "<turn|>". Throws Error for an id out of range;
  // an id inside the range that has no token gives an empty string. As in the Rust library, an added
  // token with `normalized: true` shows its normalized form (the form decode() works from).
  const std::string& token_text(int32_t id) const;

  // True for added tokens with `special: true`; false for everything else, including ids out of range.
  bool is_special(int32_t id) const;

  // Ids the file's post-processor would put before / after a single sequence (e.g. <bos> for a
  // TemplateProcessing "<bos> $A"). encode() never adds them; a checkpoint doctor can compare them
  // with what the chat template writes itself.
  std::vector<int32_t> post_processor_added_prefix() const;
  std::vector<int32_t> post_processor_added_suffix() const;

  struct Impl;  // defined in tokenizer.cc

 private:
  friend class StreamingDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  // Immutable after load, so copies of a Tokenizer can share it.
  std::shared_ptr<const Impl> impl_;
};

// Streaming detokenization for generated text: push ids one at a time and get back the text they
// complete. Chunks are always whole UTF-8 characters, and the concatenation of every push() plus
// finish() equals tokenizer.decode(all ids, skip_special_tokens).
//
// Byte-fallback tokens are held back until the run they belong to ends (a later non-byte token, or
// finish()), because a run that turns out to be invalid UTF-8 decodes to one U+FFFD per byte of the
// whole run, which changes even bytes that already looked like complete characters.
class StreamingDecoder {
 public:
  // Keeps a reference: the tokenizer must outlive the decoder.
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  std::string push(int32_t id);
  // Flushes what is held back (an unfinished byte run becomes U+FFFD as decode() would) and resets
  // the decoder for a new sequence.
  std::string finish();

 private:
  std::string emit(std::string text, bool at_end);

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> pending_;  // ids of the byte-fallback run not yet decoded
  // State of a Strip decoder that runs after Fuse, i.e. on the text as a whole.
  size_t strip_start_left_;      // leading characters it may still remove
  std::string held_back_tail_;   // trailing strip characters that may turn out to be the end
  bool emitted_tokens_ = false;  // for files without a decoder, which join tokens with spaces
};

}  // namespace gemma4rt
