// FlacFrames over streams built here byte by byte: frame headers with their CRC-8, payloads
// that hold false syncs, a stream cut short, a STREAMINFO without its total.
#include "audio/flac_frames.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

namespace stoker::audio {
namespace {

constexpr uint32_t kBlock = 1152;
constexpr uint32_t kRate = 16000;

uint8_t crc8(const std::vector<uint8_t>& b) {
  uint8_t c = 0;
  for (uint8_t byte : b) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = static_cast<uint8_t>((c & 0x80) ? (c << 1) ^ 0x07 : c << 1);
  }
  return c;
}

std::vector<uint8_t> as_vector(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

// `tail` after `head` (resize and copy: GCC 12 warns of a vector insert's memcpy at -O3).
void append(std::vector<uint8_t>& head, std::span<const uint8_t> tail) {
  const size_t at = head.size();
  head.resize(at + tail.size());
  if (!tail.empty()) std::memcpy(head.data() + at, tail.data(), tail.size());
}

// A fixed-block-size frame header of 16-bit mono audio: frame `number`, `block` samples (coded
// in 16 bits), the rate from STREAMINFO; CRC-8 last.
std::vector<uint8_t> header(uint32_t number, uint32_t block = kBlock) {
  std::vector<uint8_t> h = {0xFF, 0xF8, 0x70, 0x08};  // block code 7, rate code 0; mono, 16 bits
  if (number < 0x80) {
    h.push_back(static_cast<uint8_t>(number));
  } else {  // two bytes of UTF-8 (numbers below 0x800)
    h.push_back(static_cast<uint8_t>(0xC0 | (number >> 6)));
    h.push_back(static_cast<uint8_t>(0x80 | (number & 0x3F)));
  }
  h.push_back(static_cast<uint8_t>((block - 1) >> 8));
  h.push_back(static_cast<uint8_t>((block - 1) & 0xFF));
  h.push_back(crc8(h));
  return h;
}

struct Stream {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint8_t>> frames;  // each frame's bytes, header included
};

// "fLaC", STREAMINFO (16 kHz mono 16-bit, blocks of kBlock, `total` samples: 0 = unknown), then
// `n` frames of 40 to 300 bytes (the last one short of a block where total says so). Frame 3's
// payload holds a sync with a wrong CRC, frame 5's a whole valid header of frame 9.
Stream stream(uint32_t n, uint64_t total) {
  Stream s;
  s.bytes = {'f', 'L', 'a', 'C', 0x80, 0, 0, 34};  // the last metadata block: STREAMINFO, 34 bytes
  uint8_t info[34] = {};
  info[0] = kBlock >> 8, info[1] = kBlock & 0xFF, info[2] = kBlock >> 8, info[3] = kBlock & 0xFF;
  info[10] = static_cast<uint8_t>(kRate >> 12);
  info[11] = static_cast<uint8_t>((kRate >> 4) & 0xFF);
  info[12] = static_cast<uint8_t>(((kRate & 0xF) << 4) | (0 << 1) | (15 >> 4));  // mono, 16 bits
  info[13] = static_cast<uint8_t>(((15 & 0xF) << 4) | ((total >> 32) & 0xF));
  for (int k = 0; k < 4; ++k) info[14 + k] = static_cast<uint8_t>(total >> (24 - 8 * k));
  append(s.bytes, info);
  for (uint32_t f = 0; f < n; ++f) {
    const uint32_t block =
        total > 0 && f == n - 1 ? static_cast<uint32_t>(total - f * kBlock) : kBlock;
    std::vector<uint8_t> frame = header(f, block);
    for (uint32_t k = 0; k < 40 + (f * 37) % 260; ++k)
      frame.push_back(static_cast<uint8_t>((f * 131 + k * 7) % 251));  // never 0xFF
    if (f == 3) frame.insert(frame.begin() + 20, {0xFF, 0xF8, 0x70, 0x08, 0x05, 0x04, 0x7F, 0x00});
    if (f == 5) {
      const std::vector<uint8_t> fake = header(9);
      frame.insert(frame.begin() + 30, fake.begin(), fake.end());
    }
    s.frames.push_back(frame);
    append(s.bytes, frame);
  }
  return s;
}

std::optional<FlacFrames> open(const std::vector<uint8_t>& bytes) {
  return FlacFrames::open(
      [&bytes](int64_t pos, uint8_t* dst, int64_t n) -> int64_t {
        if (pos >= static_cast<int64_t>(bytes.size())) return 0;
        const int64_t k = std::min<int64_t>(n, static_cast<int64_t>(bytes.size()) - pos);
        std::memcpy(dst, bytes.data() + pos, static_cast<size_t>(k));
        return k;
      },
      static_cast<int64_t>(bytes.size()));
}

TEST(FlacFrames, FramesEndAtTheNextHeaderWithTheirNumberNotAtAFalseSync) {
  const uint32_t n = 12;
  const Stream s = stream(n, uint64_t{n - 1} * kBlock + 500);
  std::optional<FlacFrames> frames = open(s.bytes);
  ASSERT_TRUE(frames);
  EXPECT_EQ(frames->info().rate, kRate);
  EXPECT_EQ(frames->info().channels, 1u);
  EXPECT_EQ(frames->info().bits, 16u);
  EXPECT_EQ(frames->info().total, uint64_t{n - 1} * kBlock + 500);
  std::span<const uint8_t> bytes;
  uint64_t first = 0;
  for (uint32_t f = 0; f < n; ++f) {
    ASSERT_TRUE(frames->next(&bytes, &first)) << f;
    EXPECT_EQ(first, uint64_t{f} * kBlock);
    EXPECT_EQ(as_vector(bytes), s.frames[f]) << "frame " << f;
  }
  EXPECT_FALSE(frames->next(&bytes, &first));
}

TEST(FlacFrames, ASeekLandsOnTheFrameThatHoldsTheSampleWhetherOrNotTheTotalIsKnown) {
  const uint32_t n = 300;  // frame numbers of two UTF-8 bytes past 127
  for (const uint64_t total : {uint64_t{n - 1} * kBlock + 700, uint64_t{0}}) {
    const Stream s = stream(n, total);
    std::optional<FlacFrames> frames = open(s.bytes);
    ASSERT_TRUE(frames);
    std::span<const uint8_t> bytes;
    uint64_t first = 0;
    for (const uint64_t sample :
         {uint64_t{0}, uint64_t{1}, uint64_t{kBlock - 1}, uint64_t{kBlock}, uint64_t{5000},
          uint64_t{3} * kBlock + 10, uint64_t{5} * kBlock + 1, uint64_t{150} * kBlock + 3,
          uint64_t{n - 1} * kBlock + 699}) {
      ASSERT_TRUE(frames->seek(sample)) << sample << " total " << total;
      ASSERT_TRUE(frames->next(&bytes, &first));
      EXPECT_EQ(first, sample / kBlock * kBlock) << sample << " total " << total;
      EXPECT_EQ(as_vector(bytes), s.frames[sample / kBlock]) << sample;
    }
    if (total > 0) {
      EXPECT_FALSE(frames->seek(total));  // past the end
    }
  }
}

TEST(FlacFrames, AStreamCutShortEndsWithWhatIsLeftOfItsLastFrame) {
  const Stream s = stream(8, 0);
  const size_t cut = s.bytes.size() - s.frames[7].size() / 2;
  const std::vector<uint8_t> short_bytes(s.bytes.begin(), s.bytes.begin() + cut);
  std::optional<FlacFrames> frames = open(short_bytes);
  ASSERT_TRUE(frames);
  ASSERT_TRUE(frames->seek(6 * kBlock));
  std::span<const uint8_t> bytes;
  uint64_t first = 0;
  ASSERT_TRUE(frames->next(&bytes, &first));
  EXPECT_EQ(as_vector(bytes), s.frames[6]);
  ASSERT_TRUE(frames->next(&bytes, &first));
  EXPECT_EQ(first, 7 * kBlock);
  EXPECT_EQ(bytes.size(), s.frames[7].size() - s.frames[7].size() / 2);
  EXPECT_FALSE(frames->next(&bytes, &first));
}

TEST(FlacFrames, WhatIsNotANativeFlacStreamIsNotOpened) {
  const Stream s = stream(4, 4 * kBlock);
  EXPECT_FALSE(open({}));
  EXPECT_FALSE(open(std::vector<uint8_t>(s.bytes.begin(), s.bytes.begin() + 30)));  // no frame
  std::vector<uint8_t> tagged(3, 0);  // FLAC behind an ID3 tag: FFmpeg's to probe
  std::memcpy(tagged.data(), "ID3", 3);
  append(tagged, s.bytes);
  EXPECT_FALSE(open(tagged));
  std::vector<uint8_t> bad_crc = s.bytes;
  bad_crc[42 + 7] ^= 1;  // the first frame's CRC-8
  EXPECT_FALSE(open(bad_crc));
  std::vector<uint8_t> stereo = s.bytes;
  stereo[42 + 3] = 0x18;  // a frame of two channels in a mono stream
  EXPECT_FALSE(open(stereo));
}

}  // namespace
}  // namespace stoker::audio
