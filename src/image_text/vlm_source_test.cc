#include "stoker/image_text/vlm_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>

#include "engine/test_temp_dir.h"
#include "image/test_images.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/image_text/patch_processor.h"
#include "stoker/sources/documents.h"
#include "stoker/sources/image_files.h"

namespace stoker::image_text {
namespace {

constexpr int64_t kImage = 9;  // the placeholder token

// Conversations as token lists, with the tokens trained on given (an assistant's).
class Conversations final : public DocumentSet {
 public:
  Conversations(std::vector<std::vector<int64_t>> tokens, std::vector<std::vector<uint8_t>> trained)
      : tokens_(std::move(tokens)), trained_(std::move(trained)) {}
  uint64_t num_documents() const override { return tokens_.size(); }
  uint64_t num_tokens() const override {
    uint64_t n = 0;
    for (const auto& t : tokens_) n += t.size();
    return n;
  }
  uint64_t document_length(uint64_t d) const override { return tokens_[d].size(); }
  void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const override {
    std::memcpy(out, tokens_[d].data() + offset, count * sizeof(int64_t));
  }
  std::string path(uint64_t d) const override { return "chat.jsonl:" + std::to_string(d + 1); }
  bool has_untrained_tokens() const override { return true; }
  void read_trained(uint64_t d, uint64_t offset, uint64_t count, uint8_t* out) const override {
    std::memcpy(out, trained_[d].data() + offset, count);
  }

 private:
  std::vector<std::vector<int64_t>> tokens_;
  std::vector<std::vector<uint8_t>> trained_;
};

struct Fixture {
  testing::TempDir dir;
  std::vector<std::string> files;
  std::vector<std::pair<int, int>> sizes = {{40, 30}, {64, 64}, {30, 90}};  // w, h

  Fixture() {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto [w, h] = sizes[i];
      const std::vector<uint8_t> rgb = image::testing::pattern_rgb(w, h, static_cast<int>(i));
      const auto png = image::testing::encode_png(rgb.data(), static_cast<size_t>(w) * 3, w, h,
                                                  /*color_type=*/2, 8);
      files.push_back(dir.path("img" + std::to_string(i) + ".png"));
      std::ofstream(files.back(), std::ios::binary)
          .write(reinterpret_cast<const char*>(png.data()),
                 static_cast<std::streamsize>(png.size()));
    }
  }

  std::shared_ptr<const FileRanges> images() const {
    std::vector<FileRanges::Range> r;
    for (uint32_t i = 0; i < files.size(); ++i) r.push_back({i, 0, FileRanges::kWholeFile});
    return std::make_shared<FileRanges>(files, r);
  }

  // Qwen2-VL's processor at 4 px patches (8 px merge blocks), up to 64 x 64 pixels.
  static std::shared_ptr<const PatchProcessor> small_patches() {
    return std::make_shared<PatchProcessor>(PatchProcessorOptions{.patch_size = 4,
                                                                  .merge_size = 2,
                                                                  .temporal_patch_size = 2,
                                                                  .min_pixels = 16,
                                                                  .max_pixels = 64 * 64});
  }

  // Three conversations: [user: img0] [assistant]; [user: no image] [assistant];
  // [user: img1, img2] [assistant].
  VLMOptions options() const {
    VLMOptions o;
    o.documents = std::make_shared<Conversations>(
        std::vector<std::vector<int64_t>>{
            {1, kImage, 2, 3, 4}, {1, 5, 3, 6, 7}, {1, kImage, kImage, 2, 3, 8}},
        std::vector<std::vector<uint8_t>>{{0, 0, 0, 1, 1}, {0, 0, 1, 1, 1}, {0, 0, 0, 0, 1, 1}});
    o.image_starts = {0, 1, 1, 3};
    o.image_ids = {0, 1, 2};
    o.images = images();
    o.image_token = kImage;
    o.pipeline = std::make_shared<image::ImagePipeline>(std::vector<image::Transform>{
        image::Resize(8, 8), image::ToTensor(image::DType::kFloat32, image::Layout::kCHW)});
    o.tokens_per_image = 4;
    o.threads = 2;
    return o;
  }
};

struct Sample {
  std::vector<int64_t> ids, labels, third;
  std::vector<float> pixels;
  std::vector<int64_t> grid;
  std::vector<int32_t> cu;
  int32_t max_seqlen = 0;
};

Sample read(const VLMSource& s, uint64_t i) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::byte*> slots;
  for (const FieldSpec& f : s.fields()) bufs.emplace_back(std::max<size_t>(f.sample_bytes(), 4));
  for (auto& b : bufs) slots.push_back(b.data());
  s.read({1, 0, i}, slots, nullptr);
  Sample out;
  const uint64_t n = s.length(i);
  const auto ints = [&](size_t f, uint64_t count) {
    const auto* p = reinterpret_cast<const int64_t*>(bufs[f].data());
    return std::vector<int64_t>(p, p + count);
  };
  out.ids = ints(0, n);
  out.labels = ints(1, n);
  out.third = ints(2, n);
  const FieldSpec& px = s.fields()[3];
  const uint64_t rows = s.group_length(i, 1);
  const auto* f = reinterpret_cast<const float*>(bufs[3].data());
  out.pixels.assign(f, f + rows * px.row_bytes() / sizeof(float));
  size_t next = 4;
  if (s.fields().size() > next && s.fields()[next].name == "image_grid_thw")
    out.grid = ints(next++, s.group_length(i, 2) * 3);
  if (s.fields().size() > next) {
    const auto* c = reinterpret_cast<const int32_t*>(bufs[next].data());
    out.cu.assign(c, c + s.group_length(i, s.fields()[next].ragged_group));
    std::memcpy(&out.max_seqlen, bufs[next + 1].data(), 4);
  }
  return out;
}

TEST(VLMSource, ExpandsEachPlaceholderToTheImageTokensAndLabelsOnlyTheAssistant) {
  Fixture fx;
  const VLMSource s(fx.options());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s.lengths(), (std::vector<uint64_t>{8, 5, 12}));
  const std::vector<std::string> names = {"input_ids", "labels", "attention_mask", "pixel_values"};
  ASSERT_EQ(s.fields().size(), names.size());
  for (size_t f = 0; f < names.size(); ++f) EXPECT_EQ(s.fields()[f].name, names[f]);
  EXPECT_EQ(s.fields()[3].shape, (std::vector<int64_t>{2, 3, 8, 8}));
  EXPECT_EQ(s.fields()[3].ragged_group, 1u);

  const Sample a = read(s, 0);
  EXPECT_EQ(a.ids, (std::vector<int64_t>{1, 9, 9, 9, 9, 2, 3, 4}));
  EXPECT_EQ(a.labels, (std::vector<int64_t>{-100, -100, -100, -100, -100, -100, 3, 4}));
  EXPECT_EQ(a.third, std::vector<int64_t>(8, 1));
  EXPECT_EQ(s.group_length(0, 1), 1u);
  // The pixels are the pipeline's on the file.
  std::ifstream in(fx.files[0], std::ios::binary);
  std::vector<std::byte> bytes;
  for (char c; in.get(c);) bytes.push_back(static_cast<std::byte>(c));
  std::vector<float> want(3 * 8 * 8);
  image::ImageScratch scratch;
  SampleRng rng(1, 0, 0);
  fx.options().pipeline->run(bytes, rng, reinterpret_cast<std::byte*>(want.data()), scratch);
  EXPECT_EQ(a.pixels, want);

  const Sample b = read(s, 1);  // no image
  EXPECT_EQ(b.labels, (std::vector<int64_t>{-100, -100, 3, 6, 7}));
  EXPECT_EQ(s.group_length(1, 1), 0u);
  const Sample c = read(s, 2);
  EXPECT_EQ(std::count(c.ids.begin(), c.ids.end(), kImage), 8);
  EXPECT_EQ(c.pixels.size(), 2u * 3 * 8 * 8);
  EXPECT_EQ(s.stats().image_tokens, 12u);
  EXPECT_EQ(s.stats().tokens, 25u);
}

TEST(VLMSource, DynamicImagesTakeTheirTokensAndPatchesFromTheirSize) {
  Fixture fx;
  VLMOptions o = fx.options();
  o.pipeline = nullptr;
  o.tokens_per_image = 0;
  o.dynamic = Fixture::small_patches();
  const auto& p = static_cast<const PatchProcessor&>(*o.dynamic);
  const VLMSource s(o);
  const auto tokens = [&](int i) {
    return static_cast<uint64_t>(p.image_tokens(fx.sizes[i].second, fx.sizes[i].first));
  };
  EXPECT_EQ(s.length(0), 4 + tokens(0));
  EXPECT_EQ(s.length(2), 4 + tokens(1) + tokens(2));
  EXPECT_EQ(s.fields()[4].name, "image_grid_thw");
  const Sample c = read(s, 2);
  // Each image's patches, one after the other, as the processor makes them.
  std::vector<float> want;
  std::vector<int64_t> grids;
  for (int i : {1, 2}) {
    std::ifstream in(fx.files[i], std::ios::binary);
    std::vector<std::byte> bytes;
    for (char ch; in.get(ch);) bytes.push_back(static_cast<std::byte>(ch));
    const image::DecodedImage img = image::decode(bytes);
    const PatchGrid g = p.grid(img.height, img.width);
    std::vector<float> out(static_cast<size_t>(g.patches() * p.patch_dim()));
    std::vector<uint8_t> scratch;
    p.process(img.rgb, img.width, img.height, out, scratch);
    want.insert(want.end(), out.begin(), out.end());
    grids.insert(grids.end(), {g.t, g.h, g.w});
  }
  EXPECT_EQ(c.pixels, want);
  EXPECT_EQ(c.grid, grids);
  EXPECT_EQ(std::count(c.ids.begin(), c.ids.end(), kImage),
            static_cast<int64_t>(tokens(1) + tokens(2)));

  // mm_token_type_ids, the last field: 1 on the image tokens.
  o.token_types = true;
  const VLMSource typed(o);
  ASSERT_EQ(typed.fields().back().name, "mm_token_type_ids");
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::byte*> slots;
  for (const FieldSpec& f : typed.fields())
    bufs.emplace_back(std::max<size_t>(f.sample_bytes(), 8));
  for (auto& b : bufs) slots.push_back(b.data());
  typed.read({1, 0, 2}, slots, nullptr);
  const auto* types = reinterpret_cast<const int64_t*>(bufs.back().data());
  for (size_t t = 0; t < c.ids.size(); ++t) EXPECT_EQ(types[t], c.ids[t] == kImage ? 1 : 0) << t;
}

TEST(VLMSource, PacksWholeConversationsByTokensWithCuSeqlens) {
  Fixture fx;
  VLMOptions o = fx.options();
  o.shuffle_conversations = false;
  o.seq_len = 13;  // 12 alone; 8 + 5 together
  const VLMSource s(o);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s.documents_of(0), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(s.documents_of(1), (std::vector<uint64_t>{2}));
  EXPECT_EQ(s.fields()[2].name, "position_ids");
  const Sample a = read(s, 0);
  EXPECT_EQ(a.ids, (std::vector<int64_t>{1, 9, 9, 9, 9, 2, 3, 4, 1, 5, 3, 6, 7}));
  EXPECT_EQ(a.third, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4}));
  EXPECT_EQ(a.cu, (std::vector<int32_t>{0, 8, 13}));
  EXPECT_EQ(a.max_seqlen, 8);
  EXPECT_EQ(s.stats().padding, 2u * 13 - 25);
  EXPECT_NE(s.path(0).find("chat.jsonl:1 (and 1 more"), std::string::npos);
  // Too short for a conversation: a bad one, named.
  o.seq_len = 10;
  try {
    VLMSource bad(o);
    FAIL() << "a conversation longer than seq_len was packed";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 2u);
    EXPECT_NE(std::string(e.what()).find("12 tokens"), std::string::npos) << e.what();
  }
}

// Packed and dynamic with mrope: position_ids are [tokens, 4], the text position and Qwen2-VL's
// M-RoPE (t, h, w): text tokens the running position on all three, an image's tokens that
// position plus (0, row, column) in its merged grid, the position then advancing by the
// grid's longer side.
TEST(VLMSource, PackedDynamicSamplesHaveMropePositions) {
  Fixture fx;
  VLMOptions o = fx.options();
  o.pipeline = nullptr;
  o.tokens_per_image = 0;
  o.dynamic = Fixture::small_patches();
  o.shuffle_conversations = false;
  o.seq_len = 120;
  o.mrope = true;
  const VLMSource s(o);
  ASSERT_EQ(s.fields()[2].name, "position_ids");
  EXPECT_EQ(s.fields()[2].shape, (std::vector<int64_t>{117, 4}));  // the longest pack's
  const auto positions = [&](uint64_t i) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<std::byte*> slots;
    for (const FieldSpec& f : s.fields()) bufs.emplace_back(std::max<size_t>(f.sample_bytes(), 8));
    for (auto& b : bufs) slots.push_back(b.data());
    s.read({1, 0, i}, slots, nullptr);
    const auto* p = reinterpret_cast<const int64_t*>(bufs[2].data());
    return std::vector<int64_t>(p, p + 4 * s.length(i));
  };
  for (uint64_t i = 0; i < s.size(); ++i) {
    const std::vector<int64_t> pos = positions(i);
    uint64_t at = 0;
    for (const uint64_t d : s.documents_of(i)) {
      // img0 is 40x30: an 8x10 patch grid, 4x5 merged; img1 64x64: 8x8; img2 30x90: 11x4.
      struct Item {
        bool image;
        int64_t rows, columns;
      };
      const std::vector<std::vector<Item>> items = {
          {{false, 1, 1}, {true, 4, 5}, {false, 1, 1}, {false, 1, 1}, {false, 1, 1}},
          {{false, 1, 1}, {false, 1, 1}, {false, 1, 1}, {false, 1, 1}, {false, 1, 1}},
          {{false, 1, 1},
           {true, 8, 8},
           {true, 11, 4},
           {false, 1, 1},
           {false, 1, 1},
           {false, 1, 1}}};
      int64_t rope = 0, text = 0;
      for (const Item& item : items[d]) {
        for (int64_t r = 0; r < item.rows * item.columns; ++r, ++at, ++text) {
          const int64_t* p = pos.data() + 4 * at;
          const int64_t want[4] = {text, rope, rope + (item.image ? r / item.columns : 0),
                                   rope + (item.image ? r % item.columns : 0)};
          ASSERT_EQ(std::vector<int64_t>(p, p + 4), std::vector<int64_t>(want, want + 4))
              << "document " << d << " token " << text;
        }
        rope += std::max(item.rows, item.columns);
      }
    }
    EXPECT_EQ(at, s.length(i));
  }
  // Conversation 0 (a pack of its own: 24 tokens, the others 112 + 5): its eighth image token
  // is row 1, column 2 of the grid placed at position 1.
  ASSERT_EQ(s.documents_of(0), (std::vector<uint64_t>{0}));
  const std::vector<int64_t> zero = positions(0);
  EXPECT_EQ(std::vector<int64_t>(zero.begin() + 4 * 8, zero.begin() + 4 * 9),
            (std::vector<int64_t>{8, 1, 2, 3}));
  // mrope needs patches and packing.
  o.seq_len = 0;
  EXPECT_THROW(VLMSource{o}, InvalidArgument);
}

TEST(VLMSource, EachEpochSwapsConversationsOfOneClassBetweenPacks) {
  // Six conversations of 4 tokens (no image) and two of 5: packs of 9 hold one of each, and
  // which ones changes with the epoch; every conversation once an epoch, the lengths the same.
  std::vector<std::vector<int64_t>> tokens;
  for (int64_t d = 0; d < 8; ++d)
    tokens.push_back(d < 6 ? std::vector<int64_t>{1, 100 + d, 3, 4}
                           : std::vector<int64_t>{1, 100 + d, 3, 4, 5});
  std::vector<std::vector<uint8_t>> trained;
  for (const auto& t : tokens) trained.emplace_back(t.size(), 1);
  Fixture fx;
  VLMOptions o = fx.options();
  o.documents = std::make_shared<Conversations>(tokens, trained);
  o.image_starts.assign(9, 0);
  o.image_ids.clear();
  o.seq_len = 9;
  const VLMSource s(o);
  ASSERT_EQ(s.size(), 4u);  // best fit: two of 5 + 4, two of 4 + 4
  std::set<std::vector<std::vector<uint64_t>>> epochs;
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::multiset<uint64_t> seen;
    std::vector<std::vector<uint64_t>> packs;
    for (uint64_t i = 0; i < s.size(); ++i) {
      const auto docs = s.documents_of(i, 7, epoch);
      uint64_t n = 0;
      for (uint64_t d : docs) n += tokens[d].size();
      EXPECT_EQ(n, s.length(i));
      seen.insert(docs.begin(), docs.end());
      packs.push_back(docs);
      // The sample read is these conversations.
      std::vector<std::byte> ids(s.fields()[0].sample_bytes()), labels(ids.size()), pos(ids.size()),
          px(4), cu(s.fields()[4].sample_bytes()), most(4);
      std::byte* slots[] = {ids.data(), labels.data(), pos.data(),
                            px.data(),  cu.data(),     most.data()};
      s.read({7, epoch, i}, slots, nullptr);
      const auto* got = reinterpret_cast<const int64_t*>(ids.data());
      EXPECT_EQ(got[1], 100 + static_cast<int64_t>(docs[0]));
    }
    EXPECT_EQ(seen.size(), 8u);
    EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), 8u);
    epochs.insert(packs);
  }
  EXPECT_GT(epochs.size(), 1u);  // the packs' members change
}

TEST(VLMSource, BadConversationsAreNamedOrSkippedAndCounted) {
  Fixture fx;
  VLMOptions o = fx.options();
  o.image_starts = {0, 1, 2, 3};  // conversation 1 has no placeholder but an image
  try {
    VLMSource bad(o);
    FAIL() << "placeholders and images differ";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 1u);
    EXPECT_EQ(e.path(), "chat.jsonl:2");
    EXPECT_NE(std::string(e.what()).find("0 image placeholders and 1 image"), std::string::npos)
        << e.what();
  }
  o.skip_bad = true;
  const VLMSource some(o);  // 2 is bad too: 2 placeholders, 1 image
  EXPECT_EQ(some.size(), 1u);
  EXPECT_EQ(some.stats().skipped, 2u);

  // A missing image.
  o = fx.options();
  std::remove(fx.files[2].c_str());
  for (bool dynamic : {false, true}) {
    if (dynamic) {
      o.pipeline = nullptr;
      o.dynamic = Fixture::small_patches();
    }
    o.skip_bad = false;
    try {
      VLMSource bad(o);
      FAIL() << "a missing image";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 2u);
      EXPECT_NE(std::string(e.what()).find("img2.png"), std::string::npos) << e.what();
      EXPECT_THROW(std::rethrow_exception(e.cause()), IoError);
    }
    o.skip_bad = true;
    const VLMSource kept(o);
    EXPECT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept.stats().skipped, 1u);
  }
}

TEST(VLMSource, RefusesInconsistentOptions) {
  Fixture fx;
  VLMOptions o = fx.options();
  o.image_starts = {0, 1, 3};
  EXPECT_THROW(VLMSource{o}, InvalidArgument);
  o = fx.options();
  o.image_ids = {0, 1, 7};
  EXPECT_THROW(VLMSource{o}, InvalidArgument);
  o = fx.options();
  o.tokens_per_image = 0;
  EXPECT_THROW(VLMSource{o}, InvalidArgument);
  o = fx.options();
  o.pipeline = nullptr;
  EXPECT_THROW(VLMSource{o}, InvalidArgument);
}

}  // namespace
}  // namespace stoker::image_text
