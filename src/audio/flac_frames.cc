#include "audio/flac_frames.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace stoker::audio {
namespace {

// Bytes read into the window at a time: a few frames of most streams.
constexpr int64_t kChunk = 64 * 1024;
// Bytes searched for a header at a time, within the window.
constexpr int64_t kScan = 4 * 1024;
// A frame header's most bytes: 4 fixed, a 7-byte number, 2 of block size, 2 of rate, the CRC.
constexpr int64_t kMaxHeader = 16;
// Interpolation probes before a seek walks frame by frame.
constexpr int kProbes = 8;

// CRC-8, polynomial x^8 + x^2 + x + 1, as a FLAC frame header's.
constexpr std::array<uint8_t, 256> crc8_table() {
  std::array<uint8_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint8_t c = static_cast<uint8_t>(i);
    for (int k = 0; k < 8; ++k) c = static_cast<uint8_t>((c & 0x80) ? (c << 1) ^ 0x07 : c << 1);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint8_t, 256> kCrc8 = crc8_table();

uint8_t crc8(const uint8_t* b, size_t n) {
  uint8_t c = 0;
  for (size_t i = 0; i < n; ++i) c = kCrc8[c ^ b[i]];
  return c;
}

constexpr std::array<uint32_t, 12> kRates = {0,     88200, 176400, 192000, 8000,  16000,
                                             22050, 24000, 32000,  44100,  48000, 96000};
constexpr std::array<uint32_t, 8> kBits = {0, 8, 12, 0, 16, 20, 24, 32};

}  // namespace

std::optional<FlacFrames> FlacFrames::open(Read read, int64_t size) {
  FlacFrames f(std::move(read), size);
  int64_t got = 0;
  const uint8_t* b = f.bytes(0, 4 + 4 + 34, &got);
  if (got < 42 || std::memcmp(b, "fLaC", 4) != 0 || (b[4] & 0x7F) != 0) return std::nullopt;
  const uint32_t length = (uint32_t{b[5]} << 16) | (uint32_t{b[6]} << 8) | b[7];
  if (length < 34) return std::nullopt;
  const uint8_t* s = b + 8;  // STREAMINFO
  FlacInfo& i = f.info_;
  i.min_block = (uint32_t{s[0]} << 8) | s[1];
  i.max_block = (uint32_t{s[2]} << 8) | s[3];
  i.min_frame = (uint32_t{s[4]} << 16) | (uint32_t{s[5]} << 8) | s[6];
  i.max_frame = (uint32_t{s[7]} << 16) | (uint32_t{s[8]} << 8) | s[9];
  i.rate = (uint32_t{s[10]} << 12) | (uint32_t{s[11]} << 4) | (s[12] >> 4);
  i.channels = ((s[12] >> 1) & 7) + 1;
  i.bits = (((s[12] & 1) << 4) | (s[13] >> 4)) + 1;
  i.total = (uint64_t{s[13] & 0x0Fu} << 32) | (uint64_t{s[14]} << 24) | (uint64_t{s[15]} << 16) |
            (uint64_t{s[16]} << 8) | s[17];
  if (i.rate == 0 || i.max_block < 16 || i.min_block > i.max_block) return std::nullopt;
  // The metadata blocks, to the first frame.
  int64_t pos = 4;
  for (bool last = false; !last;) {
    const uint8_t* h = f.bytes(pos, 4, &got);
    if (got < 4) return std::nullopt;
    last = (h[0] & 0x80) != 0;
    pos += 4 + ((int64_t{h[1]} << 16) | (int64_t{h[2]} << 8) | h[3]);
    if (pos > size) return std::nullopt;
  }
  const std::optional<Header> first = f.header_at(pos);
  if (!first || first->first != 0) return std::nullopt;
  f.first_frame_ = f.pos_ = pos;
  f.at_ = *first;
  return f;
}

const uint8_t* FlacFrames::bytes(int64_t pos, int64_t n, int64_t* got) {
  n = std::max<int64_t>(0, std::min(n, size_ - pos));
  const int64_t end = window_pos_ + static_cast<int64_t>(window_.size());
  if (pos < window_pos_ || pos + n > end) {
    // From the frame being read where this reaches past it (its bytes stay in one window).
    const int64_t from = keep_ >= 0 && keep_ <= pos ? keep_ : pos;
    const int64_t want = std::min(std::max(pos + n - from, kChunk), size_ - from);
    window_.resize(static_cast<size_t>(std::max<int64_t>(want, 0)));
    const int64_t k = want > 0 ? read_(from, window_.data(), want) : 0;
    window_.resize(static_cast<size_t>(std::max<int64_t>(k, 0)));
    window_pos_ = from;
  }
  *got = std::min(n, window_pos_ + static_cast<int64_t>(window_.size()) - pos);
  return window_.data() + (pos - window_pos_);
}

std::optional<FlacFrames::Header> FlacFrames::header_at(int64_t pos) {
  int64_t n = 0;
  const uint8_t* b = bytes(pos, kMaxHeader, &n);
  if (n < 6 || b[0] != 0xFF || (b[1] & 0xFE) != 0xF8) return std::nullopt;
  const bool variable = (b[1] & 1) != 0;
  const int block_code = b[2] >> 4, rate_code = b[2] & 15;
  const int channel_code = b[3] >> 4, bits_code = (b[3] >> 1) & 7;
  if (block_code == 0 || rate_code == 15 || channel_code > 10 || (b[3] & 1) != 0)
    return std::nullopt;
  if (channel_code < 8 ? static_cast<uint32_t>(channel_code) + 1 != info_.channels
                       : info_.channels != 2)
    return std::nullopt;
  if (bits_code != 0 && kBits[bits_code] != info_.bits) return std::nullopt;
  int64_t i = 4;
  // The frame (fixed block size) or sample (variable) number, coded as UTF-8 is.
  uint64_t number = b[i];
  int extra = 0;
  if ((number & 0x80) == 0) {
  } else if ((number & 0xE0) == 0xC0) {
    number &= 0x1F, extra = 1;
  } else if ((number & 0xF0) == 0xE0) {
    number &= 0x0F, extra = 2;
  } else if ((number & 0xF8) == 0xF0) {
    number &= 0x07, extra = 3;
  } else if ((number & 0xFC) == 0xF8) {
    number &= 0x03, extra = 4;
  } else if ((number & 0xFE) == 0xFC) {
    number &= 0x01, extra = 5;
  } else if (number == 0xFE && variable) {
    number = 0, extra = 6;
  } else {
    return std::nullopt;
  }
  ++i;
  if (i + extra > n) return std::nullopt;
  for (int k = 0; k < extra; ++k, ++i) {
    if ((b[i] & 0xC0) != 0x80) return std::nullopt;
    number = (number << 6) | (b[i] & 0x3F);
  }
  uint32_t block = 0;
  if (block_code == 1) {
    block = 192;
  } else if (block_code <= 5) {
    block = 576u << (block_code - 2);
  } else if (block_code == 6) {
    if (i + 1 > n) return std::nullopt;
    block = uint32_t{b[i]} + 1, i += 1;
  } else if (block_code == 7) {
    if (i + 2 > n) return std::nullopt;
    block = ((uint32_t{b[i]} << 8) | b[i + 1]) + 1, i += 2;
  } else {
    block = 256u << (block_code - 8);
  }
  uint32_t rate = rate_code == 0 ? info_.rate : rate_code < 12 ? kRates[rate_code] : 0;
  if (rate_code == 12) {
    if (i + 1 > n) return std::nullopt;
    rate = uint32_t{b[i]} * 1000, i += 1;
  } else if (rate_code >= 13) {
    if (i + 2 > n) return std::nullopt;
    rate = ((uint32_t{b[i]} << 8) | b[i + 1]) * (rate_code == 14 ? 10u : 1u), i += 2;
  }
  if (rate != info_.rate || block > info_.max_block || i + 1 > n) return std::nullopt;
  if (crc8(b, static_cast<size_t>(i)) != b[i]) return std::nullopt;
  // A fixed-size stream numbers its frames: each but the last holds the stream's block size.
  if (!variable && info_.min_block != info_.max_block) return std::nullopt;
  Header h;
  h.first = variable ? number : number * info_.max_block;
  h.block = block;
  h.size = static_cast<uint32_t>(i + 1);
  if (info_.total > 0 && h.first >= info_.total) return std::nullopt;
  return h;
}

int64_t FlacFrames::find(int64_t pos, int64_t limit, std::optional<uint64_t> expect, Header* h) {
  limit = std::min(limit, size_);
  while (pos < limit) {
    int64_t n = 0;
    const uint8_t* b = bytes(pos, std::min(kScan, limit - pos), &n);
    if (n <= 0) return -1;
    const auto* hit = static_cast<const uint8_t*>(std::memchr(b, 0xFF, static_cast<size_t>(n)));
    if (hit == nullptr) {
      pos += n;
      continue;
    }
    const int64_t at = pos + (hit - b);
    if (const std::optional<Header> c = header_at(at)) {
      if (expect ? c->first == *expect : [&] {
            // Any header: confirmed by the next one, where it should be.
            if (c->first + c->block >= info_.total && info_.total > 0) return true;
            Header next;
            const int64_t from = at + std::max<int64_t>(c->size, info_.min_frame);
            const int64_t to = at + (info_.max_frame > 0 ? info_.max_frame + kMaxHeader : kChunk);
            return find(from, to, c->first + c->block, &next) >= 0;
          }()) {
        *h = *c;
        return at;
      }
    }
    pos = at + 1;
  }
  return -1;
}

bool FlacFrames::seek(uint64_t sample) {
  keep_ = -1;
  Header low = *header_at(first_frame_);
  int64_t low_pos = first_frame_, high_pos = size_;
  uint64_t high_first = info_.total;  // the first sample at high_pos
  if (info_.total > 0 && sample >= info_.total) return false;
  // Interpolation: where the sample would be at the stream's mean bitrate, less a frame, then the
  // first confirmed header from there. The bounds close in from both sides.
  for (int probe = 0; probe < kProbes && info_.total > 0 && low.first + low.block <= sample;
       ++probe) {
    const double share = static_cast<double>(sample - low.first) /
                         static_cast<double>(std::max(high_first, sample + 1) - low.first);
    const int64_t frame = info_.max_frame > 0 ? info_.max_frame : kChunk / 8;
    const int64_t guess = low_pos + static_cast<int64_t>(share * (high_pos - low_pos)) - frame;
    if (guess <= low_pos + frame) break;  // near enough: walked below
    Header h;
    const int64_t at = find(guess, high_pos, std::nullopt, &h);
    if (at < 0 || h.first > sample) {
      if (at >= 0) high_first = h.first;
      high_pos = at < 0 ? guess : at;
      continue;
    }
    low = h, low_pos = at;
  }
  // Frame by frame to the one that holds the sample.
  while (low.first + low.block <= sample) {
    Header next;
    const int64_t at = find(low_pos + std::max<int64_t>(low.size, info_.min_frame), size_,
                            low.first + low.block, &next);
    if (at < 0) return false;
    low = next, low_pos = at;
  }
  pos_ = low_pos;
  at_ = low;
  return true;
}

bool FlacFrames::next(std::span<const uint8_t>* bytes_out, uint64_t* first_sample) {
  if (pos_ < 0 || pos_ >= size_) return false;
  keep_ = pos_;
  const Header h = at_;
  Header next;
  const int64_t end =
      find(pos_ + std::max<int64_t>(h.size, info_.min_frame), size_, h.first + h.block, &next);
  const int64_t stop = end < 0 ? size_ : end;
  int64_t n = 0;
  const uint8_t* b = bytes(pos_, stop - pos_, &n);
  *bytes_out = std::span<const uint8_t>(b, static_cast<size_t>(n));
  *first_sample = h.first;
  pos_ = end;  // -1: that was the last frame
  at_ = next;
  return n > 0;
}

}  // namespace stoker::audio
