#include "text/alignment.h"

#include <algorithm>
#include <optional>

#include "text/unicode.h"

namespace stoker::text {

AlignedText AlignedText::identity(std::string_view original, uint32_t origin) {
  AlignedText t{std::string(original), Alignment(original.size()), origin};
  for (size_t i = 0; i < original.size();) {
    const size_t start = i;
    next_code_point(original, i);
    const TokenSpan span{static_cast<uint32_t>(origin + start), static_cast<uint32_t>(origin + i)};
    for (size_t b = start; b < i; ++b) t.align[b] = span;
  }
  return t;
}

AlignedText AlignedText::slice(size_t begin, size_t end) const {
  AlignedText s{text.substr(begin, end - begin),
                Alignment(align.begin() + static_cast<ptrdiff_t>(begin),
                          align.begin() + static_cast<ptrdiff_t>(end)),
                origin};
  if (end > begin) s.origin = align[begin].begin;
  return s;
}

TokenSpan AlignedText::original(size_t begin, size_t end) const {
  if (end <= begin || end > align.size()) return {origin, origin};
  return {align[begin].begin, align[end - 1].end};
}

void transform(AlignedText& t, const std::vector<Change>& changes, size_t initial_removed) {
  std::string text;
  Alignment align;
  text.reserve(t.text.size());
  align.reserve(t.text.size());
  size_t at = 0;  // the next byte of the old text
  auto skip_chars = [&](size_t n) {
    for (; n > 0 && at < t.text.size(); --n) at += utf8_length(static_cast<uint8_t>(t.text[at]));
  };
  skip_chars(initial_removed);
  for (const Change& c : changes) {
    TokenSpan span;
    if (c.change > 0) {
      span = at == 0 ? TokenSpan{t.origin, t.origin} : t.align[at - 1];
    } else {
      span = at < t.align.size() ? t.align[at] : TokenSpan{t.origin, t.origin};
      skip_chars(1 + static_cast<size_t>(-c.change));
    }
    const size_t before = text.size();
    append_utf8(text, c.c);
    align.insert(align.end(), text.size() - before, span);
  }
  t.text = std::move(text);
  t.align = std::move(align);
}

// unicode-normalization-alignments (what `tokenizers` normalizes with): each character
// decomposed (its first character a replacement, the rest inserted), marks put in canonical order
// after each starter (the changes travel with their characters), then, for the composed forms,
// composed pairwise into the last starter, which takes each absorbed character's change, less 1.
std::vector<Change> normalize_changes(std::string_view s, NormalForm form) {
  const bool compat = form == NormalForm::kNfkc || form == NormalForm::kNfkd;
  struct Pending {
    int ccc;
    Change c;
  };
  std::vector<Pending> decomposed;
  decomposed.reserve(s.size());
  size_t pending = 0;  // where the marks not yet in canonical order begin
  auto sort_pending = [&] {
    std::stable_sort(decomposed.begin() + static_cast<ptrdiff_t>(pending), decomposed.end(),
                     [](const Pending& a, const Pending& b) { return a.ccc < b.ccc; });
    pending = decomposed.size();
  };
  std::vector<char32_t> parts;
  for (size_t i = 0; i < s.size();) {
    decompose(next_code_point(s, i), compat, parts);
    for (size_t k = 0; k < parts.size(); ++k) {
      const int ccc = combining_class(parts[k]);
      if (ccc == 0) sort_pending();
      decomposed.push_back({ccc, Change{parts[k], k == 0 ? 0 : 1}});
    }
  }
  sort_pending();
  std::vector<Change> out;
  out.reserve(decomposed.size());
  if (form == NormalForm::kNfd || form == NormalForm::kNfkd) {
    for (const auto& p : decomposed) out.push_back(p.c);
    return out;
  }
  // The crate's Recompositions, state for state.
  std::optional<Change> composee;
  int last_ccc = -1;  // the last blocked character's combining class; -1: none (classes are >= 0)
  std::vector<Change> blocked;
  auto flush = [&] {
    out.insert(out.end(), blocked.begin(), blocked.end());
    blocked.clear();
  };
  for (const auto& [ccc, c] : decomposed) {
    if (!composee) {
      if (ccc != 0) {
        out.push_back(c);
      } else {
        composee = c;
      }
      continue;
    }
    if (last_ccc >= 0 && last_ccc >= ccc) {  // blocked from the composee
      if (ccc == 0) {
        out.push_back(*composee);
        flush();
        composee = c;
        last_ccc = -1;
        continue;
      }
      blocked.push_back(c);
      last_ccc = ccc;
      continue;
    }
    if (auto r = compose(composee->c, c.c)) {
      composee = Change{*r, composee->change + c.change - 1};
      continue;
    }
    if (last_ccc < 0 && ccc == 0) {
      out.push_back(*composee);
      composee = c;
      continue;
    }
    blocked.push_back(c);
    last_ccc = ccc;
  }
  if (composee) out.push_back(*composee);
  flush();
  return out;
}

void prepend(AlignedText& t, std::string_view prefix) {
  if (t.text.empty() || prefix.empty()) return;
  t.text.insert(0, prefix);
  t.align.insert(t.align.begin(), prefix.size(), t.align.front());
}

}  // namespace stoker::text
