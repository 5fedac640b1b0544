// The pipeline stages around the model, each as `tokenizers` defines it: normalizers (text to
// text), pre-tokenizers (pieces to smaller pieces), decoders (tokens back to text). Each is built
// from its tokenizer.json object and is immutable afterwards. Private to src/text/.
#pragma once

#include <simdjson.h>

#include <memory>
#include <string>
#include <vector>

#include "text/alignment.h"

namespace stoker::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
  // The same text, keeping where each byte came from as `tokenizers` does (encode_with_offsets).
  virtual void normalize(AlignedText& t) const = 0;
};

// A piece of the text on its way to the model. at_origin: it starts at the original text's first
// byte (Metaspace's prepend_scheme "first" prepends to that piece only). align: each byte's
// original bytes, kept by the pre-tokenizers where encode_with_offsets asks (else empty).
struct Piece {
  std::string text;
  bool at_origin = false;
  uint32_t origin = 0;  // where the piece starts in the original text (with align)
  Alignment align = {};
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits (empty pieces dropped).
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// From a tokenizer.json object; throw InvalidArgument naming `origin` and the component type (or
// option) that is not supported. A JSON null gives nullptr.
std::unique_ptr<Normalizer> parse_normalizer(simdjson::dom::element json,
                                             const std::string& origin);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(simdjson::dom::element json,
                                                  const std::string& origin);
std::unique_ptr<Decoder> parse_decoder(simdjson::dom::element json, const std::string& origin);

// The JSON helpers the parsers share.
namespace json {
std::string type_of(simdjson::dom::element e, const std::string& origin, const char* what);
std::string string_or(simdjson::dom::element e, const char* key, const std::string& fallback);
bool bool_or(simdjson::dom::element e, const char* key, bool fallback);
int64_t int_or(simdjson::dom::element e, const char* key, int64_t fallback);
bool has(simdjson::dom::element e, const char* key);  // present and not null
}  // namespace json

}  // namespace stoker::text
