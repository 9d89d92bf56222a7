// gemma4rt tokenize: text to token ids (a JSON array) or ids back to text, with a checkpoint's
// tokenizer.json (or a tokenizer file given directly).
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"
#include "tools/token_list.h"

namespace gemma4rt::tools {
namespace {

struct TokenizeFlags {
  std::string model_dir, tokenizer_file, text, file, decode;
  bool skip_special_tokens = false;
};

int tokenize(const TokenizeFlags& flags) {
  std::filesystem::path path = flags.tokenizer_file;
  if (path.empty()) {
    if (flags.model_dir.empty()) fail("give --model DIR or --tokenizer FILE");
    path = std::filesystem::path(flags.model_dir) / "tokenizer.json";
  }
  if (!std::filesystem::exists(path)) fail("{}: file not found", path.string());
  const Tokenizer tokenizer = Tokenizer::load(path);

  if (!flags.decode.empty()) {
    const std::vector<int32_t> ids = parse_token_list(flags.decode, "--decode");
    for (int32_t id : ids) {
      if (id >= tokenizer.vocab_size()) fail("--decode: token id {} is outside the vocabulary (0..{})", id, tokenizer.vocab_size() - 1);
    }
    fmt::print("{}\n", tokenizer.decode(ids, flags.skip_special_tokens));
    return 0;
  }
  std::string text = flags.text;
  if (!flags.file.empty()) {
    std::ifstream input(flags.file, std::ios::binary);
    if (!input) fail("{}: cannot open", flags.file);
    std::ostringstream contents;
    contents << input.rdbuf();
    text = contents.str();
  }
  fmt::print("{}\n", nlohmann::json(tokenizer.encode(text)).dump());
  return 0;
}

}  // namespace

Action add_tokenize_command(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text (JSON array), or decode ids to text");
  auto* model = command->add_option("--model", flags->model_dir, "Checkpoint directory holding tokenizer.json");
  auto* tokenizer = command->add_option("--tokenizer", flags->tokenizer_file, "A tokenizer.json file");
  model->excludes(tokenizer);
  auto* text = command->add_option("--text", flags->text, "Text to tokenize (no <bos> is added)");
  auto* file = command->add_option("--file", flags->file, "File whose contents to tokenize");
  auto* decode = command->add_option("--decode", flags->decode, "Comma-separated ids to turn back into text");
  command->add_flag("--skip-special", flags->skip_special_tokens, "With --decode: leave out special tokens");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  command->callback([command] {
    if (command->count("--text") + command->count("--file") + command->count("--decode") != 1) {
      throw CLI::ValidationError("tokenize", "give exactly one of --text, --file or --decode");
    }
  });
  return [flags] { return tokenize(*flags); };
}

}  // namespace gemma4rt::tools
