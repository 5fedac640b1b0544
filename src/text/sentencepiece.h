// A SentencePiece model (a .model file: its serialized ModelProto), run by the sentencepiece
// library itself (sentencepiece::SentencePieceProcessor), so that ids are the library's. Private
// to src/text/; Tokenizer (include/stoker/text/tokenizer.h) holds one for a .model file. Built
// against libsentencepiece where src/text/CMakeLists.txt finds it (STOKER_TEXT_SENTENCEPIECE);
// elsewhere supported() is false and loading a model throws InvalidArgument saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/text/tokenizer.h"

namespace stoker::text {

class SentencePieceModel {
 public:
  // Whether this build reads SentencePiece models.
  static bool supported();

  // `serialized`: a .model file's bytes. Throws InvalidArgument naming `origin` where the library
  // does not load them as a model (or this build has no sentencepiece).
  SentencePieceModel(std::string_view serialized, const std::string& origin);
  ~SentencePieceModel();

  // EncodeAsIds; with add_special_tokens, bos_id() before and eos_id() after, each only where the
  // model defines it (>= 0). `text` is valid UTF-8 (Tokenizer checks).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // encode() and each id's bytes of `text`: EncodeAsImmutableProto's pieces' begin and end (bos
  // and eos [0, 0)).
  Encoding encode_with_offsets(std::string_view text, bool add_special_tokens) const;
  // DecodeIds of the ids in range (others are skipped); skip_special_tokens also drops the
  // control (<s>, </s>: DecodeIds renders them empty anyway) and unknown (<unk>) ids.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  size_t size() const;  // GetPieceSize
  // PieceToId, where the piece is in the model (the library answers unk_id for any other).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;  // IdToPiece, in range only

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string origin_;
};

}  // namespace stoker::text
