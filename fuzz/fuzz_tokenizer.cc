// tokenizer.json files (Tokenizer::from_json) and the texts they encode.
//
// The input is split by FuzzedDataProvider: a flag byte (bit 0: add_special_tokens, bit 1:
// skip_special_tokens), the tokenizer.json (a random-length string), then the text to encode (the
// rest). Checked: from_json throws nothing but InvalidArgument; a tokenizer it loads encodes the
// text, or throws DecodeError for text that is not UTF-8, or InvalidArgument for a character its
// model cannot represent (a Unigram without unk_id), encode and encode_with_offsets alike;
// encode_with_offsets gives encode's ids and one offset per id, each inside the text with
// begin <= end; id_to_token of every id, and decode of the ids (and of ids outside the
// vocabulary), run and throw nothing.
#include <fuzzer/FuzzedDataProvider.h>

#include <optional>
#include <string>
#include <vector>

#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  using stoker::text::Tokenizer;
  FuzzedDataProvider p(data, size);
  const uint8_t flags = p.ConsumeIntegral<uint8_t>();
  const bool add_special = flags & 1, skip_special = flags & 2;
  const std::string json = p.ConsumeRandomLengthString();
  const std::string text = p.ConsumeRemainingBytesAsString();

  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer.emplace(Tokenizer::from_json(json, "fuzz.json"));
  } catch (const stoker::InvalidArgument&) {
    return 0;
  }

  std::vector<int32_t> ids;
  bool decode_error = false, unrepresentable = false;
  try {
    ids = tokenizer->encode(text, add_special);
  } catch (const stoker::DecodeError&) {
    decode_error = true;
  } catch (const stoker::InvalidArgument&) {
    unrepresentable = true;
  }
  try {
    const stoker::text::Encoding e = tokenizer->encode_with_offsets(text, add_special);
    require(!decode_error && !unrepresentable, "encode_with_offsets accepts a text encode refuses");
    require(e.ids == ids, "encode_with_offsets' ids differ from encode's");
    require(e.offsets.size() == e.ids.size(), "not one offset per id");
    for (const auto& span : e.offsets)
      require(span.begin <= span.end && span.end <= text.size(), "an offset outside the text");
  } catch (const stoker::DecodeError&) {
    require(decode_error, "encode_with_offsets refuses a text encode accepts");
  } catch (const stoker::InvalidArgument&) {
    require(unrepresentable, "encode_with_offsets refuses a text encode accepts");
  }
  if (decode_error || unrepresentable) return 0;

  const size_t vocab = tokenizer->vocab_size();
  for (const int32_t id : ids) (void)tokenizer->id_to_token(id);
  (void)tokenizer->decode(ids, skip_special);
  std::vector<int32_t> outside = ids;
  outside.push_back(-1);
  outside.push_back(static_cast<int32_t>(vocab) + 7);
  (void)tokenizer->decode(outside, skip_special);
  return 0;
}
