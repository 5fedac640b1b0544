// tiktoken BPE files (what tiktoken's load_tiktoken_bpe reads: lines of "<base64 token> <rank>")
// and the encodings tiktoken's openai_public defines for them, since a file carries neither its
// split pattern nor its special tokens. Tokenizer (include/stoker/text/tokenizer.h) runs one as a
// byte-level BPE whose merges are tiktoken's: any adjacent pair whose bytes are a token merges,
// the lowest rank first. Private to src/text/.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker::text {

// Whether `bytes` read as a tiktoken file: its first line is base64, a space and a rank.
bool looks_like_tiktoken(std::string_view bytes);

// The (token bytes, rank) of each line. Throws InvalidArgument naming `origin` at a line that is
// not "<base64> <rank>".
std::vector<std::pair<std::string, int32_t>> parse_tiktoken(std::string_view bytes,
                                                            const std::string& origin);

// A known encoding's pattern and special tokens (cl100k_base, o200k_base, r50k_base, p50k_base,
// p50k_edit), as tiktoken's openai_public module defines them; nullopt for another name.
struct TiktokenEncoding {
  std::string pattern;
  std::map<std::string, int32_t> special_tokens;
};
std::optional<TiktokenEncoding> known_tiktoken_encoding(std::string_view name);
// The names known_tiktoken_encoding() knows, for messages.
const char* known_tiktoken_names();

}  // namespace stoker::text
