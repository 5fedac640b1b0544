// The models of the text wing: what turns one pre-tokenized piece into ids (BPE, WordPiece,
// Unigram). Each is immutable once built; encode() is safe from many threads. Private to src/text/.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "stoker/text/tokenizer.h"

namespace stoker::text {

// A string-keyed map that looks up string_views without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A model's encode() may keep a word's ids in a cache of the calling thread (bounded, one model at
// a time): ids are a function of the piece alone.
class Model {
 public:
  explicit Model(Vocab vocab);
  virtual ~Model() = default;
  // Appends the ids of one piece (already normalized and pre-tokenized) and, where `spans` is
  // given, each id's bytes of the piece, as `tokenizers`' models give a Token's offsets.
  virtual void encode(std::string_view piece, std::vector<int32_t>& out,
                      std::vector<TokenSpan>* spans = nullptr) const = 0;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the model has no such id
  size_t size() const { return vocab_.size(); }
  const Vocab& vocab() const { return vocab_; }

 protected:
  Vocab vocab_;
  std::vector<std::string> tokens_;  // by id ("" where the vocabulary skips an id)
  const uint64_t serial_;  // tells this model's entries in a thread's cache from another model's
};

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  // Words may be whole texts (no pre-tokenizer splits them): a long one is cut where no merge can
  // cross (Bpe::encode). Off elsewhere, where long words are rare and the pairs not worth building.
  bool whole_texts = false;
};

// Byte-pair encoding: a word's characters (or, with byte_fallback, the <0xXX> tokens of a
// character outside the vocabulary) merged by rank, lowest first, as `tokenizers`' Word::merge_all
// does. A merge's pair is given by its two tokens; throws InvalidArgument (naming `origin`) when a
// merge names a token outside the vocabulary. A long word (a whole text, where no pre-tokenizer
// splits it) is encoded in segments where no merge can cross, each through the thread's cache.
class Bpe : public Model {
 public:
  Bpe(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options, const std::string& origin);
  // tiktoken's BPE: the merges are implied by the ranks (the ids): any two adjacent symbols whose
  // concatenation is a token merge, the lowest such token first (leftmost on a tie), as
  // tiktoken's byte_pair_merge does. The vocabulary is byte-level (one character per byte).
  static std::unique_ptr<Bpe> from_ranks(Vocab vocab, BpeOptions options,
                                         const std::string& origin);
  void encode(std::string_view word, std::vector<int32_t>& out,
              std::vector<TokenSpan>* spans = nullptr) const override;

  // The merge loop alone: `ids` (the word's symbols) merged in place, and their byte lengths in
  // `lengths` (where given) summed alike. Exposed for the tests.
  void merge(std::vector<int32_t>& ids, std::vector<uint32_t>* lengths = nullptr) const;

 private:
  // encode() of a word taken whole: through the thread's cache when it is short.
  void encode_whole(std::string_view word, std::vector<int32_t>& out,
                    std::vector<TokenSpan>* spans) const;
  // The code point pairs (a << 32 | b) that some token holds side by side, or nullptr where a long
  // word is not to be cut (not whole_texts, or a continuing_subword_prefix, end_of_word_suffix or
  // ignore_merges makes a segment's ids depend on where it sits). Built on first use.
  const std::unordered_set<uint64_t>* adjacent_pairs() const;
  // The word's ids and, where `lengths` is given, each id's bytes of the word.
  void encode_uncached(std::string_view word, std::vector<int32_t>& ids,
                       std::vector<uint32_t>* lengths) const;
  template <bool kLengths>
  void encode_word(std::string_view word, std::vector<int32_t>& ids,
                   std::vector<uint32_t>* lengths) const;
  template <bool kLengths>
  void merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>* lengths) const;
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  // The id of each token that is one character (the lookup of a word's characters, where no
  // prefix or suffix is added to them).
  std::unordered_map<char32_t, int32_t> char_ids_;
  int32_t byte_ids_[256];  // <0xXX>'s id, or -1 (byte_fallback)
  mutable std::once_flag adjacent_once_;
  mutable std::unordered_set<uint64_t> adjacent_;
  mutable bool cuttable_ = false;  // adjacent_ applies (set once, under adjacent_once_)
};

// WordPiece (BERT): the longest vocabulary prefix, then `##`-prefixed continuations; a word with
// no such split (or longer than max_input_chars_per_word) is the unknown token.
class WordPiece : public Model {
 public:
  WordPiece(Vocab vocab, const std::string& unk_token, std::string prefix, size_t max_chars,
            const std::string& origin);
  void encode(std::string_view word, std::vector<int32_t>& out,
              std::vector<TokenSpan>* spans = nullptr) const override;

 private:
  int32_t unk_id_;
  std::string prefix_;
  size_t max_chars_;
};

// Pieces as a trie of their bytes, a node's children contiguous and sorted by byte: one walk from a
// position of a text meets every piece that starts there.
class PieceTrie {
 public:
  static constexpr int64_t kNone = -1;
  // A piece named twice is the first one's (as the vocabulary keeps it).
  explicit PieceTrie(const std::vector<std::pair<std::string, double>>& pieces);
  static constexpr uint32_t root() { return 0; }
  // The node one byte below `node`, or kNone.
  int64_t child(uint32_t node, unsigned char b) const;
  int32_t piece(uint32_t node) const { return nodes_[node].piece; }  // its index, or -1

 private:
  struct Node {
    int32_t piece = -1;
    uint32_t first = 0;  // its children: nodes [first, first + count)
    uint32_t count = 0;
  };
  std::vector<Node> nodes_;
  std::vector<unsigned char> labels_;  // each node's byte (the root's unused)
};

// Unigram: the Viterbi best segmentation by the pieces' log-probabilities (SentencePiece's
// algorithm, as `tokenizers` runs it: an unknown character scores min_score - 10; consecutive
// unknowns fuse). encode() without spans goes through the thread's cache.
class Unigram : public Model {
 public:
  Unigram(std::vector<std::pair<std::string, double>> pieces, std::optional<int32_t> unk_id,
          bool byte_fallback, const std::string& origin);
  void encode(std::string_view piece, std::vector<int32_t>& out,
              std::vector<TokenSpan>* spans = nullptr) const override;

 private:
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out,
                       std::vector<TokenSpan>* spans) const;
  std::vector<double> scores_;
  std::optional<int32_t> unk_id_;
  bool byte_fallback_;
  double min_score_;
  PieceTrie trie_;
  std::string origin_;
};

}  // namespace stoker::text
