// SentencePieceModel (text/sentencepiece.h) over sentencepiece::SentencePieceProcessor.
//
// Threads: sentencepiece_processor.h makes no thread-safety statement. What this relies on: the
// processor is loaded once, here, and never changed after (no SetEncodeExtraOptions, no
// SetVocabulary); encode, decode and the lookups call only its const methods (Encode, Decode,
// GetPieceSize, PieceToId, IdToPiece, IsControl, IsUnknown), which read the loaded model; and the
// library's own Python binding runs the encodes of one batch on many threads over one processor
// (SentencePieceProcessor.encode(..., num_threads)). Tokenizer::encode_batch does the same.
#include "text/sentencepiece.h"

#include <type_traits>

#include "stoker/errors.h"

#ifdef STOKER_TEXT_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace stoker::text {

#ifdef STOKER_TEXT_SENTENCEPIECE

static_assert(std::is_same_v<int, int32_t>, "sentencepiece's ids are int");

struct SentencePieceModel::State {
  sentencepiece::SentencePieceProcessor sp;
  int bos = -1, eos = -1, size = 0;
};

bool SentencePieceModel::supported() { return true; }

SentencePieceModel::SentencePieceModel(std::string_view serialized, const std::string& origin)
    : state_(std::make_unique<State>()), origin_(origin) {
  if (serialized.empty()) {
    throw InvalidArgument(origin + ": not a SentencePiece model (an empty file)");
  }
  if (const auto status = state_->sp.LoadFromSerializedProto(serialized); !status.ok()) {
    throw InvalidArgument(origin + ": not a SentencePiece model (sentencepiece: " +
                          status.ToString() + ")");
  }
  state_->bos = state_->sp.bos_id();
  state_->eos = state_->sp.eos_id();
  state_->size = state_->sp.GetPieceSize();
}

SentencePieceModel::~SentencePieceModel() = default;

std::vector<int32_t> SentencePieceModel::encode(std::string_view text,
                                                bool add_special_tokens) const {
  std::vector<int> ids;
  if (const auto status = state_->sp.Encode(text, &ids); !status.ok()) {
    throw InvalidArgument(origin_ + ": sentencepiece encode: " + status.ToString());
  }
  if (!add_special_tokens) return ids;
  std::vector<int32_t> framed;
  framed.reserve(ids.size() + 2);
  if (state_->bos >= 0) framed.push_back(state_->bos);
  framed.insert(framed.end(), ids.begin(), ids.end());
  if (state_->eos >= 0) framed.push_back(state_->eos);
  return framed;
}

Encoding SentencePieceModel::encode_with_offsets(std::string_view text,
                                                 bool add_special_tokens) const {
  const auto proto = state_->sp.EncodeAsImmutableProto(text);
  Encoding e;
  const size_t n = proto.pieces_size();
  e.ids.reserve(n + 2);
  e.offsets.reserve(n + 2);
  if (add_special_tokens && state_->bos >= 0) {
    e.ids.push_back(state_->bos);
    e.offsets.push_back({});
  }
  for (size_t i = 0; i < n; ++i) {
    const auto piece = proto.pieces(static_cast<int>(i));
    e.ids.push_back(static_cast<int32_t>(piece.id()));
    e.offsets.push_back({piece.begin(), piece.end()});
  }
  if (add_special_tokens && state_->eos >= 0) {
    e.ids.push_back(state_->eos);
    e.offsets.push_back({});
  }
  return e;
}

std::string SentencePieceModel::decode(const std::vector<int32_t>& ids,
                                       bool skip_special_tokens) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= state_->size) continue;
    if (skip_special_tokens && (state_->sp.IsControl(id) || state_->sp.IsUnknown(id))) continue;
    kept.push_back(id);
  }
  std::string out;
  if (const auto status = state_->sp.Decode(kept, &out); !status.ok()) {
    throw InvalidArgument(origin_ + ": sentencepiece decode: " + status.ToString());
  }
  return out;
}

size_t SentencePieceModel::size() const { return static_cast<size_t>(state_->size); }

std::optional<int32_t> SentencePieceModel::token_to_id(std::string_view token) const {
  const int id = state_->sp.PieceToId(token);
  if (id < 0 || id >= state_->size || state_->sp.IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::optional<std::string> SentencePieceModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= state_->size) return std::nullopt;
  return state_->sp.IdToPiece(id);
}

#else  // a build without libsentencepiece

struct SentencePieceModel::State {};

bool SentencePieceModel::supported() { return false; }

SentencePieceModel::SentencePieceModel(std::string_view, const std::string& origin)
    : origin_(origin) {
  throw InvalidArgument(origin + ": a SentencePiece model, and this build of the text wing has no "
                        "SentencePiece support (pkg-config found no sentencepiece when it was "
                        "built; Debian: libsentencepiece-dev)");
}

SentencePieceModel::~SentencePieceModel() = default;
std::vector<int32_t> SentencePieceModel::encode(std::string_view, bool) const { return {}; }
Encoding SentencePieceModel::encode_with_offsets(std::string_view, bool) const { return {}; }
std::string SentencePieceModel::decode(const std::vector<int32_t>&, bool) const { return {}; }
size_t SentencePieceModel::size() const { return 0; }
std::optional<int32_t> SentencePieceModel::token_to_id(std::string_view) const { return {}; }
std::optional<std::string> SentencePieceModel::id_to_token(int32_t) const { return {}; }

#endif

}  // namespace stoker::text
