#include "stoker/image/decode.h"

#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "decode_region.h"
#include "stoker/errors.h"
#include "test_images.h"

namespace stoker::image {
namespace {

using testing::as_bytes;
using testing::encode_jpeg;
using testing::encode_png;
using testing::JpegParams;
using testing::max_abs_diff;
using testing::mean_abs_diff;
using testing::mixed_files;
using testing::NamedFile;
using testing::pattern_rgb;

std::string decode_error_of(std::span<const std::byte> bytes) {
  try {
    decode(bytes);
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Sniff, KnowsJpegAndPngAndNamesOtherBytes) {
  const auto rgb = pattern_rgb(8, 8);
  EXPECT_EQ(sniff(encode_jpeg(rgb.data(), 8, 8, 3)), ImageFormat::kJpeg);
  EXPECT_EQ(sniff(encode_png(rgb.data(), 24, 8, 8, PNG_COLOR_TYPE_RGB, 8)), ImageFormat::kPng);
  EXPECT_EQ(decode_error_of({}), "unsupported image format (empty input)");
  const std::string text = "Hello, this is a text file\n";
  const std::string msg = decode_error_of(std::as_bytes(std::span(text)));
  EXPECT_NE(msg.find("unsupported image format (first bytes: 48 65 6c 6c 6f 2c 20 74)"),
            std::string::npos)
      << msg;
}

TEST(Jpeg, RoundTripAtQuality100) {
  const int w = 67, h = 45;  // not multiples of the block size
  const auto rgb = pattern_rgb(w, h);
  const auto file = encode_jpeg(rgb.data(), w, h, 3);
  const ImageInfo info = read_info(file);
  EXPECT_EQ(info.width, w);
  EXPECT_EQ(info.height, h);
  EXPECT_EQ(info.format, ImageFormat::kJpeg);
  const DecodedImage img = decode(file);
  ASSERT_EQ(img.width, w);
  ASSERT_EQ(img.height, h);
  EXPECT_LT(mean_abs_diff(img.rgb, rgb), 1.0);
  EXPECT_LE(max_abs_diff(img.rgb, rgb), 6);
}

TEST(Jpeg, ProgressiveDecodesLikeBaseline) {
  const int w = 50, h = 40;
  const auto rgb = pattern_rgb(w, h, 3);
  const DecodedImage base = decode(encode_jpeg(rgb.data(), w, h, 3, {.quality = 90}));
  const DecodedImage prog =
      decode(encode_jpeg(rgb.data(), w, h, 3, {.quality = 90, .progressive = true}));
  EXPECT_EQ(base.rgb, prog.rgb);
}

TEST(Jpeg, GrayscaleIsReplicated) {
  const int w = 30, h = 20;
  std::vector<uint8_t> gray(w * h);
  for (int i = 0; i < w * h; ++i) gray[i] = static_cast<uint8_t>(i * 7 % 256 / 4 + 60);
  const DecodedImage img = decode(encode_jpeg(gray.data(), w, h, 1));
  std::vector<uint8_t> expect;
  for (uint8_t g : gray) expect.insert(expect.end(), {g, g, g});
  for (int i = 0; i < w * h; ++i) {
    ASSERT_EQ(img.rgb[i * 3], img.rgb[i * 3 + 1]);
    ASSERT_EQ(img.rgb[i * 3], img.rgb[i * 3 + 2]);
  }
  EXPECT_LT(mean_abs_diff(img.rgb, expect), 1.0);
}

// PIL's CMYK -> RGB, on the CMYK values PIL sees.
std::vector<uint8_t> pil_cmyk_to_rgb(const std::vector<uint8_t>& cmyk, bool inverted) {
  std::vector<uint8_t> rgb;
  for (size_t i = 0; i < cmyk.size(); i += 4) {
    auto v = [&](int c) { return inverted ? 255 - cmyk[i + c] : cmyk[i + c]; };
    const double nk = 255 - v(3);
    for (int c = 0; c < 3; ++c) rgb.push_back(static_cast<uint8_t>(nk - nk * v(c) / 255.0 + 0.5));
  }
  return rgb;
}

TEST(Jpeg, CmykAndYcckConvertLikePil) {
  const int w = 24, h = 16;
  std::vector<uint8_t> cmyk(w * h * 4);
  for (int i = 0; i < w * h; ++i) {
    cmyk[i * 4 + 0] = static_cast<uint8_t>(i * 3);
    cmyk[i * 4 + 1] = static_cast<uint8_t>(255 - i);
    cmyk[i * 4 + 2] = static_cast<uint8_t>(100);
    cmyk[i * 4 + 3] = static_cast<uint8_t>(i % 64);
  }
  for (bool adobe : {true, false}) {
    SCOPED_TRACE(adobe ? "YCCK with Adobe marker (inverted)" : "plain CMYK");
    const DecodedImage img = decode(encode_jpeg(cmyk.data(), w, h, 4, {.adobe = adobe}));
    EXPECT_LT(mean_abs_diff(img.rgb, pil_cmyk_to_rgb(cmyk, adobe)), 1.5);
  }
}

std::vector<uint8_t> rgb_of_gray(const std::vector<uint8_t>& g) {
  std::vector<uint8_t> v;
  for (uint8_t x : g) v.insert(v.end(), {x, x, x});
  return v;
}

TEST(Png, ColorTypesAndDepthsBecomeRgb8) {
  const int w = 13, h = 7;
  const auto rgb = pattern_rgb(w, h);
  // RGB 8-bit, plain and interlaced.
  for (bool interlace : {false, true}) {
    const auto f = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8, interlace);
    EXPECT_EQ(decode(f).rgb, rgb) << "interlace " << interlace;
  }
  // RGBA: alpha dropped, not composited.
  std::vector<uint8_t> rgba;
  for (int i = 0; i < w * h; ++i) {
    rgba.insert(rgba.end(), {rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2], uint8_t(i * 5)});
  }
  EXPECT_EQ(decode(encode_png(rgba.data(), w * 4, w, h, PNG_COLOR_TYPE_RGBA, 8)).rgb, rgb);
  // 16-bit RGB: high byte.
  std::vector<uint8_t> rgb16;
  for (uint8_t v : rgb) rgb16.insert(rgb16.end(), {v, uint8_t(255 - v)});
  EXPECT_EQ(decode(encode_png(rgb16.data(), w * 6, w, h, PNG_COLOR_TYPE_RGB, 16, true)).rgb, rgb);
  // Gray 8-bit and gray+alpha.
  std::vector<uint8_t> gray(w * h), ga;
  for (int i = 0; i < w * h; ++i) {
    gray[i] = static_cast<uint8_t>(i * 11);
    ga.insert(ga.end(), {gray[i], uint8_t(i)});
  }
  EXPECT_EQ(decode(encode_png(gray.data(), w, w, h, PNG_COLOR_TYPE_GRAY, 8)).rgb,
            rgb_of_gray(gray));
  EXPECT_EQ(decode(encode_png(ga.data(), w * 2, w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8)).rgb,
            rgb_of_gray(gray));
  // 1-bit gray: 0 -> 0, 1 -> 255.
  std::vector<uint8_t> bits(2 * h, 0xA5);  // 13 pixels fit in 2 bytes per row
  const DecodedImage b = decode(encode_png(bits.data(), 2, w, h, PNG_COLOR_TYPE_GRAY, 1));
  EXPECT_EQ(b.rgb[0], 255);
  EXPECT_EQ(b.rgb[3], 0);
  EXPECT_EQ(b.rgb[6], 255);
}

TEST(Png, PaletteIsExpanded) {
  const int w = 9, h = 5;
  const std::vector<uint8_t> palette = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  std::vector<uint8_t> idx(w * h), expect;
  for (int i = 0; i < w * h; ++i) {
    idx[i] = static_cast<uint8_t>(i % 4);
    expect.insert(expect.end(), palette.begin() + idx[i] * 3, palette.begin() + idx[i] * 3 + 3);
  }
  const auto f = encode_png(idx.data(), w, w, h, PNG_COLOR_TYPE_PALETTE, 8, false, palette);
  EXPECT_EQ(decode(f).rgb, expect);
}

// A palette with tRNS alphas: libpng's expansion adds an alpha channel by itself, which the
// RGB decode must drop (as PIL's convert("RGB") does) and kOverWhite composites.
TEST(Png, PaletteWithTransparencyDecodes) {
  const int w = 9, h = 5;
  const std::vector<uint8_t> palette = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  const std::vector<uint8_t> alphas = {0, 255, 128};  // the fourth colour stays opaque
  std::vector<uint8_t> idx(w * h), drop, white;
  const uint8_t on_white[4][3] = {{255, 255, 255}, {0, 255, 0}, {127, 127, 255}, {10, 20, 30}};
  for (int i = 0; i < w * h; ++i) {
    idx[i] = static_cast<uint8_t>(i % 4);
    drop.insert(drop.end(), palette.begin() + idx[i] * 3, palette.begin() + idx[i] * 3 + 3);
    white.insert(white.end(), on_white[idx[i]], on_white[idx[i]] + 3);
  }
  for (bool interlace : {false, true}) {
    const auto f =
        encode_png(idx.data(), w, w, h, PNG_COLOR_TYPE_PALETTE, 8, interlace, palette, alphas);
    EXPECT_EQ(decode(f).rgb, drop) << "interlace " << interlace;
    EXPECT_EQ(decode(f, kDefaultMaxPixels, Alpha::kOverWhite).rgb, white)
        << "interlace " << interlace;
  }
}

// Alpha::kOverWhite gives PIL's alpha_composite over white, then RGB (transformers'
// convert_to_rgb): alpha 0 is white, 255 the colour, and in between PIL's rounding (the Python
// tests compare every PNG kind with PIL itself).
TEST(Png, TransparencyCompositedOnWhiteLikePil) {
  const int w = 256, h = 3;
  std::vector<uint8_t> rgba, ga, expect_rgba, expect_ga;
  auto pil = [](uint32_t c, uint32_t a) {  // AlphaComposite.c over white, written out
    const double exact = (c * a + 255.0 * (255 - a)) / 255.0;
    return static_cast<uint8_t>(std::lround(exact));
  };
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const uint8_t a = static_cast<uint8_t>(x), c = static_cast<uint8_t>(y * 100);
      rgba.insert(rgba.end(), {c, uint8_t(255 - c), 0, a});
      expect_rgba.insert(expect_rgba.end(), {pil(c, a), pil(255 - c, a), pil(0, a)});
      ga.insert(ga.end(), {c, a});
      expect_ga.insert(expect_ga.end(), {pil(c, a), pil(c, a), pil(c, a)});
    }
  }
  for (bool interlace : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "interlace " << interlace);
    const auto f = encode_png(rgba.data(), w * 4, w, h, PNG_COLOR_TYPE_RGBA, 8, interlace);
    const DecodedImage got = decode(f, kDefaultMaxPixels, Alpha::kOverWhite);
    ASSERT_EQ(got.rgb.size(), expect_rgba.size());
    // PIL's integer rounding differs from the exact quotient's by at most 1.
    EXPECT_LE(max_abs_diff(got.rgb, expect_rgba), 1);
    EXPECT_EQ(got.rgb[0], 255);                        // alpha 0: white
    EXPECT_EQ(got.rgb[255 * 3 + 1], 255);              // alpha 255: the colour
    EXPECT_EQ(got.rgb[(w + 128) * 3], pil(100, 128));  // c 100, alpha 128
    EXPECT_EQ(got.rgb[(2 * w + 128) * 3 + 2], 127);    // c 0, alpha 128: PIL's 127
    EXPECT_EQ(got.rgb[(2 * w + 255) * 3], 200);        // opaque: unchanged
    const auto g = encode_png(ga.data(), w * 2, w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, interlace);
    EXPECT_LE(max_abs_diff(decode(g, kDefaultMaxPixels, Alpha::kOverWhite).rgb, expect_ga), 1);
  }
  // An opaque image is the same either way; a region of a composited image is its crop.
  const auto rgb = pattern_rgb(31, 17);
  const auto opaque = encode_png(rgb.data(), 31 * 3, 31, 17, PNG_COLOR_TYPE_RGB, 8);
  EXPECT_EQ(decode(opaque, kDefaultMaxPixels, Alpha::kOverWhite).rgb, rgb);
  const auto f = encode_png(rgba.data(), w * 4, w, h, PNG_COLOR_TYPE_RGBA, 8);
  const DecodedImage full = decode(f, kDefaultMaxPixels, Alpha::kOverWhite);
  internal::RegionDecoder region;
  region.open(f, kDefaultMaxPixels, Alpha::kOverWhite);
  const internal::DecodedRegion r = region.decode(8, {100, 1, 180, 3});
  for (int y = 1; y < 3; ++y) {
    ASSERT_EQ(0, std::memcmp(r.rgb + (y - r.rect.y0) * r.stride + (100 - r.rect.x0) * 3,
                             full.rgb.data() + (y * w + 100) * 3, 80 * 3))
        << "row " << y;
  }
}

// --- Bad input: always DecodeError, with a message that says what went wrong. ---

TEST(BadInput, TruncatedJpegAtSeveralPoints) {
  const auto rgb = pattern_rgb(64, 48);
  for (bool progressive : {false, true}) {
    const auto f = encode_jpeg(rgb.data(), 64, 48, 3, {.quality = 90, .progressive = progressive});
    for (size_t cut : {size_t{1}, size_t{3}, size_t{20}, size_t{200}, f.size() / 2, f.size() - 10,
                       f.size() - 2}) {
      const std::string msg = decode_error_of(std::span(f).first(cut));
      EXPECT_TRUE(msg.starts_with("JPEG: ") || msg.starts_with("unsupported"))
          << "cut " << cut << ": " << msg;
    }
    EXPECT_NE(decode_error_of(std::span(f).first(f.size() / 2)).find("Premature end"),
              std::string::npos);
  }
}

TEST(BadInput, TruncatedPng) {
  const auto rgb = pattern_rgb(40, 30);
  const auto f = encode_png(rgb.data(), 120, 40, 30, PNG_COLOR_TYPE_RGB, 8);
  for (size_t cut : {size_t{5}, size_t{8}, size_t{20}, size_t{40}, f.size() / 2}) {
    const std::string msg = decode_error_of(std::span(f).first(cut));
    EXPECT_TRUE(msg.starts_with("PNG: ") || msg.starts_with("unsupported"))
        << "cut " << cut << ": " << msg;
  }
}

TEST(BadInput, RandomBytesAfterValidMagic) {
  std::mt19937 gen(42);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::byte> f(200 + trial * 13);
    for (auto& b : f) b = std::byte(gen() & 0xFF);
    const bool jpeg = trial % 2 == 0;
    const std::vector<uint8_t> magic =
        jpeg ? std::vector<uint8_t>{0xFF, 0xD8, 0xFF}
             : std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    for (size_t i = 0; i < magic.size(); ++i) f[i] = std::byte(magic[i]);
    EXPECT_THROW(decode(f), DecodeError);
  }
}

TEST(BadInput, CorruptedJpegBodyNeverCrashes) {
  const auto rgb = pattern_rgb(64, 64);
  const auto good = encode_jpeg(rgb.data(), 64, 64, 3, {.quality = 80});
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    auto f = good;
    for (int k = 0; k < 4; ++k) f[gen() % f.size()] = std::byte(gen() & 0xFF);
    try {
      decode(f);  // some corruptions still decode; they must not crash
    } catch (const DecodeError&) {
    }
  }
}

TEST(BadInput, CorruptJpegHeader) {
  const auto rgb = pattern_rgb(16, 16);
  auto f = encode_jpeg(rgb.data(), 16, 16, 3);
  // Find SOF0 and claim 0 components.
  for (size_t i = 0; i + 9 < f.size(); ++i) {
    if (f[i] == std::byte{0xFF} && f[i + 1] == std::byte{0xC0}) {
      f[i + 9] = std::byte{0};
      break;
    }
  }
  EXPECT_TRUE(decode_error_of(f).starts_with("JPEG: ")) << decode_error_of(f);
}

TEST(BadInput, CorruptPngHeaderCrc) {
  const auto rgb = pattern_rgb(16, 16);
  auto f = encode_png(rgb.data(), 48, 16, 16, PNG_COLOR_TYPE_RGB, 8);
  f[20] ^= std::byte{0x01};  // inside IHDR data: the CRC no longer matches
  const std::string msg = decode_error_of(f);
  EXPECT_NE(msg.find("CRC"), std::string::npos) << msg;
}

void put_be32(std::vector<std::byte>& f, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) f[at + i] = std::byte((v >> (24 - 8 * i)) & 0xFF);
}

TEST(BadInput, PixelLimitCheckedFromTheHeader) {
  const auto rgb = pattern_rgb(16, 16);
  // JPEG whose SOF claims 65000 x 65000 (the format's maximum is 65535).
  auto j = encode_jpeg(rgb.data(), 16, 16, 3);
  for (size_t i = 0; i + 9 < j.size(); ++i) {
    if (j[i] == std::byte{0xFF} && j[i + 1] == std::byte{0xC0}) {
      j[i + 5] = std::byte{0xFD}, j[i + 6] = std::byte{0xE8};  // height 65000
      j[i + 7] = std::byte{0xFD}, j[i + 8] = std::byte{0xE8};  // width 65000
      break;
    }
  }
  const std::string jmsg = decode_error_of(j);
  EXPECT_NE(jmsg.find("65000x65000"), std::string::npos) << jmsg;
  EXPECT_NE(jmsg.find("89478485"), std::string::npos) << jmsg;
  EXPECT_THROW(read_info(j), DecodeError);
  // PNG whose IHDR claims 100000 x 100000, with a valid CRC.
  auto p = encode_png(rgb.data(), 48, 16, 16, PNG_COLOR_TYPE_RGB, 8);
  put_be32(p, 16, 100000);
  put_be32(p, 20, 100000);
  put_be32(p, 29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(&p[12]), 17)));
  const std::string pmsg = decode_error_of(p);
  EXPECT_NE(pmsg.find("100000x100000"), std::string::npos) << pmsg;
  EXPECT_NE(pmsg.find("limit"), std::string::npos) << pmsg;
  // A smaller limit applies too.
  EXPECT_THROW(decode(encode_jpeg(rgb.data(), 16, 16, 3), 255), DecodeError);
  EXPECT_NO_THROW(decode(encode_jpeg(rgb.data(), 16, 16, 3), 256));
}

// --- Partial decoding equals full decoding + crop (no DCT scaling). ---

void expect_region_matches_full(const std::vector<std::byte>& f, internal::Rect want) {
  const DecodedImage full = decode(f);
  internal::RegionDecoder decoder;
  decoder.open(f, kDefaultMaxPixels);
  const internal::DecodedRegion r = decoder.decode(8, want);
  ASSERT_LE(r.rect.x0, want.x0);
  ASSERT_GE(r.rect.x1, want.x1);
  ASSERT_LE(r.rect.y0, want.y0);
  ASSERT_GE(r.rect.y1, want.y1);
  for (int y = want.y0; y < want.y1; ++y) {
    for (int x = want.x0; x < want.x1; ++x) {
      for (int c = 0; c < 3; ++c) {
        const uint8_t got = r.rgb[(y - r.rect.y0) * r.stride + (x - r.rect.x0) * 3 + c];
        ASSERT_EQ(got, full.rgb[(y * full.width + x) * 3 + c]) << "x " << x << " y " << y;
      }
    }
  }
}

TEST(PartialDecode, EqualsFullDecodeThenCrop) {
  const int w = 203, h = 151;
  const auto rgb = pattern_rgb(w, h, 5);
  const internal::Rect rects[] = {{0, 0, w, h},    {37, 21, 120, 90}, {0, 50, 17, 51},
                                  {150, 0, w, 33}, {64, 64, 80, 80},  {1, 1, w - 1, h - 1}};
  for (bool subsample : {false, true}) {
    for (bool progressive : {false, true}) {
      const auto f = encode_jpeg(
          rgb.data(), w, h, 3, {.quality = 85, .progressive = progressive, .subsample = subsample});
      for (const auto& r : rects) {
        SCOPED_TRACE(::testing::Message()
                     << "subsample " << subsample << " progressive " << progressive << " rect "
                     << r.x0 << "," << r.y0 << "," << r.x1 << "," << r.y1);
        expect_region_matches_full(f, r);
      }
    }
  }
  const auto png = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8);
  for (const auto& r : rects) expect_region_matches_full(png, r);
}

// Multi-scan files (progressive, or one scan per component) skip each scan's data below the
// region; the rows kept must still be exactly those of a full decode, at every scale, with and
// without restart markers, wherever the region ends (iMCU row boundaries included).
TEST(PartialDecode, MultiScanFilesCutBelowTheRegionAndStayExact) {
  const int w = 173, h = 301;
  const auto rgb = pattern_rgb(w, h, 11);
  std::vector<uint8_t> gray(w * h);
  for (int i = 0; i < w * h; ++i) gray[i] = rgb[i * 3 + 1];
  struct Case {
    const char* name;
    std::vector<std::byte> file;
  };
  const Case cases[] = {
      {"progressive 4:2:0",
       encode_jpeg(rgb.data(), w, h, 3, {.quality = 88, .progressive = true, .subsample = true})},
      {"progressive 4:4:4", encode_jpeg(rgb.data(), w, h, 3, {.quality = 70, .progressive = true})},
      {"progressive gray", encode_jpeg(gray.data(), w, h, 1, {.quality = 90, .progressive = true})},
      {"progressive, restart markers",
       encode_jpeg(rgb.data(), w, h, 3,
                   {.quality = 85, .progressive = true, .subsample = true, .restart_rows = 1})},
      {"one scan per component",
       encode_jpeg(rgb.data(), w, h, 3,
                   {.quality = 85, .subsample = true, .non_interleaved = true})},
  };
  // Pixels of `want` from a decode, packed.
  auto pixels = [](const internal::DecodedRegion& r, internal::Rect want) {
    std::vector<uint8_t> v;
    for (int y = want.y0; y < want.y1; ++y) {
      const uint8_t* p = r.rgb + (y - r.rect.y0) * r.stride + (want.x0 - r.rect.x0) * 3;
      v.insert(v.end(), p, p + want.width() * 3);
    }
    return v;
  };
  internal::RegionDecoder d;
  for (const Case& c : cases) {
    for (int num : {8, 4, 2}) {
      const int sw = internal::scaled_size(w, num), sh = internal::scaled_size(h, num);
      const internal::Rect all{0, 0, sw, sh};
      d.open(c.file, kDefaultMaxPixels);
      const std::vector<uint8_t> full = pixels(d.decode(num, all), all);
      const int lines = 2 * num;  // output rows per iMCU row of 4:2:0 (of 4:4:4: half of it)
      for (int y1 : {1, lines - 1, lines, lines + 1, 2 * lines, 3 * lines - 1, sh / 2,
                     sh - lines - 1, sh - lines, sh - 2, sh - 1}) {
        for (int y0 : {0, y1 / 2, y1 - 1}) {
          const internal::Rect want{sw / 5, y0, sw - sw / 4, y1};
          SCOPED_TRACE(::testing::Message()
                       << c.name << ", scale " << num << "/8, rows " << y0 << ".." << y1);
          d.open(c.file, kDefaultMaxPixels);
          const std::vector<uint8_t> got = pixels(d.decode(num, want), want);
          std::vector<uint8_t> expect;
          for (int y = y0; y < y1; ++y) {
            const auto row = full.begin() + (static_cast<size_t>(y) * sw + want.x0) * 3;
            expect.insert(expect.end(), row, row + want.width() * 3);
          }
          ASSERT_EQ(got, expect);
        }
      }
    }
  }
}

TEST(PartialDecode, DctScalingGivesTheScaledSize) {
  const int w = 200, h = 120;
  const auto rgb = pattern_rgb(w, h);
  const auto f = encode_jpeg(rgb.data(), w, h, 3, {.subsample = true});
  internal::RegionDecoder decoder;
  for (int num : {1, 2, 3, 4, 5, 6, 7, 8}) {
    const int sw = internal::scaled_size(w, num), sh = internal::scaled_size(h, num);
    decoder.open(f, kDefaultMaxPixels);
    const auto r = decoder.decode(num, {0, 0, sw, sh});
    EXPECT_EQ(r.rect.width(), sw);
    EXPECT_EQ(r.rect.height(), sh);
    // A downscaled gradient keeps its mean colour.
    double mean = 0;
    for (int i = 0; i < sw * sh; ++i) mean += r.rgb[i * 3];
    EXPECT_NEAR(mean / (sw * sh), 127.5, 3.0) << num;
  }
}

// --- One Decoder for many images: what a worker thread does. ---

TEST(Decoder, OneDecoderDecodesEveryKindOfFileAsAFreshOneDoes) {
  const std::vector<NamedFile> files = mixed_files();
  Decoder decoder;
  DecodedImage img;
  for (int round = 0; round < 2; ++round) {
    for (const NamedFile& f : files) {
      SCOPED_TRACE(f.name);
      if (!f.good) {
        // A failed image (libjpeg longjmps out of the middle of a decode) leaves the decoder
        // ready for the next one.
        EXPECT_THROW(decoder.decode(f.bytes, img), DecodeError);
        EXPECT_THROW(decoder.decode(f.bytes, img), DecodeError);
        continue;
      }
      decoder.decode(f.bytes, img);
      const DecodedImage fresh = decode(f.bytes);
      EXPECT_EQ(img.width, fresh.width);
      EXPECT_EQ(img.height, fresh.height);
      EXPECT_EQ(img.rgb, fresh.rgb);
      EXPECT_EQ(decoder.read_info(f.bytes).width, fresh.width);
    }
  }
}

TEST(Decoder, RegionAfterAFailureEqualsAFreshRegion) {
  // The region path (crop, skipped rows, early stop, DCT scaling) after each failure.
  const std::vector<NamedFile> files = mixed_files();
  internal::RegionDecoder reused;
  for (const NamedFile& bad : files) {
    if (bad.good) continue;
    EXPECT_THROW(
        {
          const ImageInfo info = reused.open(bad.bytes, kDefaultMaxPixels);
          reused.decode(8, {0, 0, info.width, info.height});
        },
        DecodeError)
        << bad.name;
    for (const NamedFile& good : files) {
      if (!good.good) continue;
      SCOPED_TRACE(bad.name + " then " + good.name);
      for (int num : {8, 4}) {
        const ImageInfo info = reused.open(good.bytes, kDefaultMaxPixels);
        if (info.format == ImageFormat::kPng && num != 8) continue;
        const internal::Rect want{internal::scaled_size(11, num), internal::scaled_size(9, num),
                                  internal::scaled_size(60, num), internal::scaled_size(41, num)};
        const internal::DecodedRegion a = reused.decode(num, want);
        std::vector<uint8_t> got;
        for (int y = want.y0; y < want.y1; ++y) {
          const uint8_t* p = a.rgb + (y - a.rect.y0) * a.stride + (want.x0 - a.rect.x0) * 3;
          got.insert(got.end(), p, p + want.width() * 3);
        }
        internal::RegionDecoder fresh;
        fresh.open(good.bytes, kDefaultMaxPixels);
        const internal::DecodedRegion b = fresh.decode(num, want);
        std::vector<uint8_t> expect;
        for (int y = want.y0; y < want.y1; ++y) {
          const uint8_t* p = b.rgb + (y - b.rect.y0) * b.stride + (want.x0 - b.rect.x0) * 3;
          expect.insert(expect.end(), p, p + want.width() * 3);
        }
        ASSERT_EQ(got, expect) << "scale " << num;
      }
    }
  }
}

TEST(Decoder, OpenWithoutDecodeThenTheNextImage) {
  // A header read whose image is never decoded (read_info, or a plan that gave up) must not
  // leave libjpeg mid-image.
  const std::vector<NamedFile> files = mixed_files();
  internal::RegionDecoder d;
  for (const NamedFile& f : files) {
    if (!f.good) continue;
    d.open(f.bytes, kDefaultMaxPixels);  // and no decode
  }
  const NamedFile& last = files.back();
  const ImageInfo info = d.open(last.bytes, kDefaultMaxPixels);
  std::vector<uint8_t> all;
  d.decode_all(all);
  EXPECT_EQ(all, decode(last.bytes).rgb);
  EXPECT_THROW(d.decode(8, {0, 0, info.width, info.height}), Error);  // one decode per open
}
}  // namespace
}  // namespace stoker::image
