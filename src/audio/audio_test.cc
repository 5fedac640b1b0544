#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stoker/audio/audio_members.h"
#include "stoker/audio/audio_source.h"
#include "stoker/audio/decoder.h"
#include "stoker/audio/features.h"
#include "stoker/audio/spec_augment.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::audio {
namespace {

namespace fs = std::filesystem;

// A 16-bit PCM WAV of `channels` channels: channel c is a sine of `hz` * (c + 1).
std::string write_wav(const std::string& name, int rate, int channels, int frames, double hz,
                      bool truncate = false) {
  const fs::path path = fs::path(::testing::TempDir()) / name;
  std::ofstream f(path, std::ios::binary);
  auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  auto u16 = [&](uint16_t v) { f.write(reinterpret_cast<const char*>(&v), 2); };
  const uint32_t data = static_cast<uint32_t>(frames) * channels * 2;
  f.write("RIFF", 4);
  u32(36 + data);
  f.write("WAVEfmt ", 8);
  u32(16);
  u16(1);
  u16(static_cast<uint16_t>(channels));
  u32(static_cast<uint32_t>(rate));
  u32(static_cast<uint32_t>(rate * channels * 2));
  u16(static_cast<uint16_t>(channels * 2));
  u16(16);
  f.write("data", 4);
  u32(data);
  const int written = truncate ? frames / 4 : frames;
  for (int i = 0; i < written; ++i) {
    for (int c = 0; c < channels; ++c) {
      const double v = 0.5 * std::sin(2 * std::numbers::pi * hz * (c + 1) * i / rate);
      u16(static_cast<uint16_t>(static_cast<int16_t>(std::lround(v * 32767))));
    }
  }
  return path.string();
}

TEST(AudioDecoder, ProbesAWavWithoutDecoding) {
  const std::string path = write_wav("probe.wav", 8000, 2, 8000 * 3, 440);
  const AudioInfo info = probe(path);
  EXPECT_NEAR(info.duration, 3.0, 1e-3);
  EXPECT_EQ(info.sample_rate, 8000);
  EXPECT_EQ(info.channels, 2);
  EXPECT_EQ(info.codec, "pcm_s16le");
  fs::remove(path);
}

TEST(AudioDecoder, ACutAtTheFilesRateIsItsSliceExactly) {
  const std::string path = write_wav("cut.wav", 16000, 1, 16000 * 4, 300);
  AudioDecoder d;
  std::vector<float> whole, cut;
  EXPECT_EQ(d.decode(path, 0, 0, {16000, true}, whole), 1);
  ASSERT_EQ(whole.size(), 64000u);
  d.decode(path, 1.5, 0.5, {16000, true}, cut);
  ASSERT_EQ(cut.size(), 8000u);
  for (size_t i = 0; i < cut.size(); ++i) ASSERT_FLOAT_EQ(cut[i], whole[24000 + i]) << i;
  fs::remove(path);
}

TEST(AudioDecoder, MonoAveragesTheChannelsAndResamples) {
  const std::string path = write_wav("stereo.wav", 44100, 2, 44100, 200);
  AudioDecoder d;
  std::vector<float> both, mono;
  EXPECT_EQ(d.decode(path, 0, 0, {44100, false}, both), 2);
  d.decode(path, 0, 0, {44100, true}, mono);
  ASSERT_EQ(both.size(), 2 * mono.size());
  for (size_t i = 0; i < mono.size(); i += 97)
    ASSERT_NEAR(mono[i], 0.5f * (both[2 * i] + both[2 * i + 1]), 1e-6);
  std::vector<float> low;
  DecodeTimes times;
  d.decode(path, 0, 0, {16000, true}, low, &times);
  EXPECT_NEAR(static_cast<double>(low.size()), 16000.0, 2.0);
  EXPECT_GT(times.resample, 0.0);
  fs::remove(path);
}

TEST(AudioDecoder, BadFilesAreDecodeErrorsNamingTheFile) {
  const fs::path dir = ::testing::TempDir();
  const std::string empty = (dir / "empty.wav").string();
  std::ofstream(empty).close();
  const std::string junk = (dir / "junk.wav").string();
  std::ofstream(junk) << std::string(4096, 'x');
  const std::string wav = write_wav("short.wav", 16000, 1, 16000, 100);
  AudioDecoder d;
  std::vector<float> out;
  for (const std::string& p : {empty, junk}) {
    try {
      d.decode(p, 0, 0, {}, out);
      FAIL() << p;
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(d.decode((dir / "missing.wav").string(), 0, 0, {}, out), IoError);
  try {
    d.decode(wav, 5, 1, {}, out);
    FAIL();
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("past the end"), std::string::npos) << e.what();
  }
  for (const auto& p : {empty, junk, wav}) fs::remove(p);
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return {b, b + s.size()};
}

TEST(AudioDecoder, BytesInMemoryDecodeAsTheirFileDoes) {
  const std::string path = write_wav("memory.wav", 44100, 2, 44100 * 2, 250);
  const std::vector<std::byte> bytes = file_bytes(path);
  const AudioInfo a = probe(path), b = probe(bytes, "memory");
  EXPECT_EQ(a.duration, b.duration);
  EXPECT_EQ(a.sample_rate, b.sample_rate);
  EXPECT_EQ(a.channels, b.channels);
  EXPECT_EQ(a.codec, b.codec);
  AudioDecoder d;
  for (const DecodeOptions& o : {DecodeOptions{16000, true}, DecodeOptions{22050, false, 1.1}}) {
    for (const auto& [offset, duration] : {std::pair{0.0, 0.0}, std::pair{0.7, 0.5}}) {
      std::vector<float> from_file, from_memory;
      const int c1 = d.decode(path, offset, duration, o, from_file);
      const int c2 = d.decode(bytes, "memory", offset, duration, o, from_memory);
      EXPECT_EQ(c1, c2);
      ASSERT_FALSE(from_file.empty());
      EXPECT_EQ(from_file, from_memory) << offset;  // bit-identical
    }
  }
  fs::remove(path);
}

TEST(AudioDecoder, BytesInMemorySeekPastTheirEndAsAFileDoes) {
  // After its data, a chunk whose size runs past the end of the file, then a second data chunk
  // inside that size: on a file the demuxer skips past the end (and stops); the bytes in memory
  // must do the same (the fuzzer found them reading the second chunk when that seek failed).
  const std::string path = write_wav("past_end.wav", 8000, 1, 800, 440);
  {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    const uint32_t big = 1u << 20, small = 800;
    f.write("JUNK", 4);
    f.write(reinterpret_cast<const char*>(&big), 4);
    f.write("data", 4);
    f.write(reinterpret_cast<const char*>(&small), 4);
    f << std::string(small, '\x10');
  }
  AudioDecoder d;
  std::vector<float> from_file, from_memory;
  d.decode(path, 0, 0, {8000, true}, from_file);
  d.decode(file_bytes(path), "past_end", 0, 0, {8000, true}, from_memory);
  EXPECT_EQ(from_file.size(), 800u);
  EXPECT_EQ(from_file, from_memory);
  fs::remove(path);
}

TEST(AudioDecoder, BadBytesAreDecodeErrorsNamingThem) {
  AudioDecoder d;
  std::vector<float> out;
  const std::vector<std::byte> junk(4096, std::byte{'x'});
  for (const std::span<const std::byte> bytes : {std::span<const std::byte>(), std::span(junk)}) {
    try {
      d.decode(bytes, "shard.tar:key", 0, 0, {}, out);
      FAIL() << bytes.size();
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find("shard.tar:key"), std::string::npos) << e.what();
    }
  }
  // A truncated member decodes short of its header's duration (AudioSource checks it).
  const std::string path = write_wav("memory_cut.wav", 16000, 1, 16000, 100, /*truncate=*/true);
  const std::vector<std::byte> cut = file_bytes(path);
  EXPECT_EQ(probe(cut, "cut").duration, probe(path).duration);
  d.decode(cut, "cut", 0, 0, {}, out);
  EXPECT_EQ(out.size(), 4000u);
  fs::remove(path);
}

TEST(AudioSource, ClipsOfMembersReadAsTheirFiles) {
  const std::string a = write_wav("members_a.wav", 44100, 1, 44100, 300);
  const std::string b = write_wav("members_b.wav", 16000, 1, 8000, 500, /*truncate=*/true);
  std::vector<std::byte> buffer = file_bytes(a);
  const std::vector<std::byte> second = file_bytes(b);
  const uint64_t split = buffer.size();
  buffer.insert(buffer.end(), second.begin(), second.end());
  EXPECT_THROW(BufferAudioMembers(buffer, {0, split}), InvalidArgument);
  auto members =
      std::make_shared<BufferAudioMembers>(buffer, std::vector<uint64_t>{0, split, buffer.size()});
  AudioOptions o;
  o.max_duration = 1.0;
  EXPECT_THROW(AudioSource({{"x", 0, 1.0, 2}}, o, {}, members), InvalidArgument);
  const AudioSource files({{a, 0.25, 0.5}}, o);
  const AudioSource source({{"mem:a", 0.25, 0.5, 0}, {"mem:b", 0, 0.5, 1}}, o, {}, members);
  std::vector<float> want(8000), got(8000);
  int64_t index = -1;
  auto state = source.make_worker_state();
  std::byte* want_slots[] = {reinterpret_cast<std::byte*>(want.data()),
                             reinterpret_cast<std::byte*>(&index)};
  std::byte* got_slots[] = {reinterpret_cast<std::byte*>(got.data()),
                            reinterpret_cast<std::byte*>(&index)};
  files.read({0, 0, 0}, want_slots, files.make_worker_state().get());
  source.read({0, 0, 0}, got_slots, state.get());
  EXPECT_EQ(want, got);
  try {
    source.read({0, 0, 1}, got_slots, state.get());
    FAIL();
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("mem:b"), std::string::npos) << e.what();
  }
  const std::vector<MemberInfo> infos = probe_members(*members, {"mem:a", "mem:b"}, 2);
  EXPECT_NEAR(infos[0].info.duration, 1.0, 1e-3);
  EXPECT_TRUE(infos[0].error.empty());
  fs::remove(a);
  fs::remove(b);
}

TEST(AudioSource, ATruncatedFileIsADecodeErrorAndGoodClipsAreTheirLength) {
  const std::string good = write_wav("good.wav", 16000, 1, 16000, 100);
  const std::string cut = write_wav("truncated.wav", 16000, 1, 16000, 100, /*truncate=*/true);
  AudioOptions o;
  o.max_duration = 1.0;
  AudioSource source({{good, 0, 1.0}, {good, 0.25, 0.5}, {cut, 0, 1.0}}, o);
  EXPECT_EQ(source.length(0), 16000u);
  EXPECT_EQ(source.length(1), 8000u);
  auto state = source.make_worker_state();
  std::vector<float> audio(16000);
  int64_t index = -1;
  std::byte* slots[] = {reinterpret_cast<std::byte*>(audio.data()),
                        reinterpret_cast<std::byte*>(&index)};
  source.read({0, 0, 1}, slots, state.get());
  EXPECT_EQ(index, 1);
  EXPECT_THROW(source.read({0, 0, 2}, slots, state.get()), DecodeError);
  EXPECT_EQ(source.stats().clips, 1u);
  fs::remove(good);
  fs::remove(cut);
}

TEST(AudioSource, ThreadsReadConcurrentlyEachWithItsOwnState) {
  const std::string a = write_wav("threads_a.wav", 44100, 2, 44100, 300);
  const std::string b = write_wav("threads_b.wav", 16000, 1, 16000, 500);
  AudioOptions o;
  o.max_duration = 1.0;
  o.features = FeatureOptions{};
  const AudioSource source({{a, 0, 1.0}, {b, 0.5, 0.5}, {a, 0.25, 0.5}, {b, 0, 1.0}}, o);
  std::vector<std::vector<float>> first(source.size());
  auto run = [&](uint64_t index, std::vector<float>& out) {
    auto state = source.make_worker_state();
    out.assign(source.length(index) * 80, -1.0f);
    int64_t i = -1;
    std::byte* slots[] = {reinterpret_cast<std::byte*>(out.data()),
                          reinterpret_cast<std::byte*>(&i)};
    source.read({0, 0, index}, slots, state.get());
  };
  for (uint64_t i = 0; i < source.size(); ++i) run(i, first[i]);
  std::vector<std::vector<float>> again(source.size());
  std::vector<std::thread> threads;
  for (uint64_t i = 0; i < source.size(); ++i) threads.emplace_back(run, i, std::ref(again[i]));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(first, again);
  EXPECT_EQ(source.stats().clips, 8u);
  fs::remove(a);
  fs::remove(b);
}

TEST(FeatureExtractor, FrameCountsAreKaldisAndWhispers) {
  FeatureOptions f;
  const FeatureExtractor fbank(f);
  EXPECT_EQ(fbank.frames(399), 0);
  EXPECT_EQ(fbank.frames(16000), 98);  // 1 + (16000 - 400) / 160
  f.kind = FeatureOptions::Kind::kLogMel;
  EXPECT_EQ(FeatureExtractor(f).frames(16000), 100);
  f.pad_30s = true;
  EXPECT_EQ(FeatureExtractor(f).frames(16000), 3000);
}

TEST(FeatureExtractor, ASineLightsTheMelBinOfItsFrequency) {
  std::vector<float> wave(16000);
  for (size_t i = 0; i < wave.size(); ++i)
    wave[i] = static_cast<float>(0.5 * std::sin(2 * std::numbers::pi * 1000.0 * i / 16000));
  for (auto kind : {FeatureOptions::Kind::kFbank, FeatureOptions::Kind::kLogMel}) {
    FeatureOptions f;
    f.kind = kind;
    const FeatureExtractor x(f);
    std::vector<float> out(x.frames(16000) * x.bins());
    FeatureScratch scratch;
    x.compute(wave, out.data(), scratch);
    const float* row = out.data() + 50 * x.bins();
    const int peak = static_cast<int>(std::max_element(row, row + x.bins()) - row);
    // 1 kHz is mel bin ~ 24 (Kaldi's scale) or ~ 19 (Slaney's) of 80 up to 8 kHz
    EXPECT_GE(peak, 15) << static_cast<int>(kind);
    EXPECT_LE(peak, 30) << static_cast<int>(kind);
  }
}

TEST(SpecAugment, MasksBandsWithinTheirWidthsTheSameForTheSameKey) {
  const int64_t frames = 200;
  const int bins = 40;
  std::vector<float> plain(frames * bins);
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = 1.0f + static_cast<float>(i % 97);
  SpecAugmentOptions o;
  o.freq_width = 6;
  o.time_width = 30;
  o.max_time_fraction = 0.2;  // 40 frames in all: two masks of at most 20
  auto masked = [&](uint64_t epoch) {
    std::vector<float> f = plain;
    SampleRng rng(7, epoch, 3);
    spec_augment(o, rng, f.data(), frames, bins);
    return f;
  };
  const std::vector<float> a = masked(0);
  EXPECT_EQ(a, masked(0));
  EXPECT_NE(a, masked(1));
  for (uint64_t epoch = 0; epoch < 20; ++epoch) {
    const std::vector<float> f = masked(epoch);
    int cols = 0, rows = 0;
    for (int b = 0; b < bins; ++b) {
      bool all = true;
      for (int64_t t = 0; t < frames; ++t) all &= f[t * bins + b] == 0.0f;
      cols += all;
    }
    for (int64_t t = 0; t < frames; ++t) {
      bool all = true;
      for (int b = 0; b < bins; ++b) all &= f[t * bins + b] == 0.0f;
      rows += all;
    }
    EXPECT_LE(cols, 2 * 6);
    EXPECT_LE(rows, 2 * 20);
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] != 0.0f) {
        EXPECT_EQ(f[i], plain[i]);
      }
    }
  }
  o.time_width = 0;
  EXPECT_THROW(validate(o), InvalidArgument);
}

TEST(AudioSource, SpeedAndLabelsWriteTheirFields) {
  const std::string path = write_wav("speed.wav", 16000, 1, 16000, 440);
  AudioOptions o;
  o.max_duration = 1.0;
  o.speeds = {0.8, 1.25};
  AudioLabels labels{{5, 6, 7}, {0, 3, 3}};
  const AudioSource source({{path, 0, 1.0}, {path, 0.5, 0.5}}, o, labels);
  ASSERT_EQ(source.fields().size(), 5u);
  EXPECT_EQ(source.fields()[2].name, "labels");
  EXPECT_EQ(source.fields()[2].shape, std::vector<int64_t>{3});
  EXPECT_EQ(source.fields()[4].name, "perturbed_length");
  EXPECT_EQ(source.length(0), 20000u);  // the slowest speed's: 16000 / 0.8
  EXPECT_EQ(source.length(1), 10000u);
  auto state = source.make_worker_state();
  std::vector<float> audio(20000, -1.0f);
  int64_t index = -1, ids[3] = {}, n_ids = -1, n = -1;
  std::byte* slots[] = {reinterpret_cast<std::byte*>(audio.data()),
                        reinterpret_cast<std::byte*>(&index), reinterpret_cast<std::byte*>(ids),
                        reinterpret_cast<std::byte*>(&n_ids), reinterpret_cast<std::byte*>(&n)};
  std::set<int64_t> lengths;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    source.read({1, epoch, 0}, slots, state.get());
    EXPECT_TRUE(n == 20000 || n == 12800) << n;  // 16000 / 0.8 or / 1.25
    lengths.insert(n);
    for (int64_t i = n; i < 20000; ++i) ASSERT_EQ(audio[i], 0.0f);
    EXPECT_EQ(std::vector<int64_t>(ids, ids + 3), (std::vector<int64_t>{5, 6, 7}));
    EXPECT_EQ(n_ids, 3);
  }
  EXPECT_EQ(lengths.size(), 2u);  // both speeds drawn over the epochs
  source.read({1, 0, 1}, slots, state.get());
  EXPECT_EQ(std::vector<int64_t>(ids, ids + 3), (std::vector<int64_t>{-100, -100, -100}));
  EXPECT_EQ(n_ids, 0);
  EXPECT_THROW(AudioSource({{path, 0, 1.0}}, o, AudioLabels{{1}, {0, 2}}), InvalidArgument);
  fs::remove(path);
}

}  // namespace
}  // namespace stoker::audio
