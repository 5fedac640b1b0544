// What the text wing's fuzz targets share: a small byte-level BPE tokenizer.json (every byte a
// token, so any UTF-8 text encodes) and a chat template with a {% generation %} block.
#pragma once

#include <cstdio>
#include <string>

namespace stoker::fuzz {

// Ids: 0-255 the bytes (GPT-2's byte-to-character map), 256-259 four merges ("he", "Ġt", "Ġthe",
// "in"), 260 the special token <|endoftext|>.
constexpr int kTextVocabSize = 261;
constexpr int kEndOfText = 260;

inline std::string byte_level_tokenizer_json() {
  // GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for
  // U+0100 onwards, in byte order.
  std::string vocab;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int c = printable ? b : next++;
    char entry[24];
    std::snprintf(entry, sizeof entry, "%s\"\\u%04x\": %d", b ? ", " : "", c, b);
    vocab += entry;
  }
  return R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 260, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
              "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {)" +
         vocab + R"(, "he": 256, "\u0120t": 257, "\u0120the": 258, "in": 259},
            "merges": [["h", "e"], ["\u0120", "t"], ["\u0120t", "he"], ["i", "n"]]}})";
}

// A conversation template whose assistant turns are generation blocks (assistant-only loss).
inline const char* generation_chat_template() {
  return "{{ bos_token }}{% for m in messages %}"
         "{% if m['role'] == 'assistant' %}<|assistant|>{% generation %}{{ m['content'] }}"
         "<|endoftext|>{% endgeneration %}"
         "{% elif m['role'] == 'system' %}<|system|>{{ m['content'] | trim }}\n"
         "{% else %}<|user|>{{ m['content'] }}\n{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}";
}

}  // namespace stoker::fuzz
