#include "stoker/image_text/image_text_source.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "engine/test_temp_dir.h"
#include "image/test_images.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/image_text/patch_processor.h"
#include "stoker/text/tokenizer.h"

namespace stoker::image_text {
namespace {

// A minimal ustar writer, for tests only.
class TarWriter {
 public:
  void member(const std::string& name, std::string_view data) {
    std::string h(512, '\0');
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(h.data() + 100, 8, "%07o", 0644);
    std::snprintf(h.data() + 108, 8, "%07o", 0);
    std::snprintf(h.data() + 116, 8, "%07o", 0);
    std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
    std::snprintf(h.data() + 136, 12, "%011o", 0);
    h[156] = '0';
    std::memcpy(h.data() + 257, "ustar\0", 6);
    std::memcpy(h.data() + 263, "00", 2);
    std::memset(h.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(h.data() + 148, 8, "%06o", sum);
    h[155] = ' ';
    bytes_ += h;
    bytes_ += data;
    bytes_.append((512 - data.size() % 512) % 512, '\0');
  }
  std::string finish() const { return bytes_ + std::string(1024, '\0'); }

 private:
  std::string bytes_;
};

const testing::TempDir& test_dir() {
  static const testing::TempDir dir;
  return dir;
}

std::string write_file(const std::string& name, const std::string& data) {
  const std::string path = test_dir().path(name);
  std::ofstream(path, std::ios::binary)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

std::string jpeg(int seed) {
  const auto rgb = image::testing::pattern_rgb(16, 16, seed);
  const auto bytes = image::testing::encode_jpeg(rgb.data(), 16, 16, 3);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A float32 .npy (version 1.0) of `values` in the given shape text, e.g. "(2,)".
std::string npy(const std::vector<float>& values, const std::string& shape, char kind = 'f') {
  std::string dict = "{'descr': '<" + std::string(1, kind) +
                     "4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return out;
}

// Byte-level BPE with a TemplateProcessing post-processor: <s> $A </s>.
const char* kTokenizer = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 10, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true},
    {"id": 11, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "</s>", "type_id": 0}}],
    "pair": [], "special_tokens": {
      "<s>": {"id": "<s>", "ids": [10], "tokens": ["<s>"]},
      "</s>": {"id": "</s>", "ids": [11], "tokens": ["</s>"]}}},
  "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"h": 0, "i": 1, "\u0120": 2, "y": 3, "o": 4, "u": 5, "hi": 6, "\u0120y": 7,
                      "\u0120you": 8, "ou": 9},
            "merges": [["h", "i"], ["\u0120", "y"], ["o", "u"], ["\u0120y", "ou"]]}
})";

struct Fixture {
  std::shared_ptr<const text::Tokenizer> tokenizer =
      std::make_shared<const text::Tokenizer>(text::Tokenizer::from_json(kTokenizer));
  std::shared_ptr<const image::ImagePipeline> pipeline =
      std::make_shared<image::ImagePipeline>(std::vector<image::Transform>{
          image::Resize(8, 8), image::ToTensor(image::DType::kUInt8, image::Layout::kHWC)});

  Options options(uint32_t max_length = 6) const {
    Options o;
    FieldOptions img;
    img.kind = FieldKind::kImage;
    img.name = "pixel_values";
    img.exts = {"jpg", "png"};
    img.pipeline = pipeline;
    FieldOptions txt;
    txt.kind = FieldKind::kText;
    txt.name = "input_ids";
    txt.mask_name = "attention_mask";
    txt.exts = {"txt"};
    txt.tokenizer = tokenizer;
    txt.max_length = max_length;
    txt.pad_id = 11;
    FieldOptions sim;
    sim.kind = FieldKind::kJson;
    sim.name = "similarity";
    sim.key = "meta.similarity";
    sim.exts = {"json"};
    sim.has_default = true;
    sim.default_value = {-1};
    FieldOptions label;
    label.kind = FieldKind::kLabel;
    label.name = "labels";
    label.exts = {"cls"};
    o.fields = {img, txt, sim, label};
    return o;
  }
};

struct Read {
  std::vector<std::vector<std::byte>> slots;
  template <typename T>
  std::vector<T> values(size_t f) const {
    std::vector<T> v(slots[f].size() / sizeof(T));
    std::memcpy(v.data(), slots[f].data(), slots[f].size());
    return v;
  }
};

Read read_sample(const Source& s, uint64_t i) {
  Read r;
  std::vector<std::byte*> ptrs;
  for (const FieldSpec& f : s.fields()) r.slots.emplace_back(f.sample_bytes());
  for (auto& v : r.slots) ptrs.push_back(v.data());
  s.read({0, 0, i}, ptrs, nullptr);
  return r;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ImageTextSource, ReadsEveryFieldOfASample) {
  TarWriter t;
  t.member("a.jpg", jpeg(1));
  t.member("a.txt", "hi you");
  t.member("a.json", R"({"meta": {"similarity": 0.25}})");
  t.member("a.cls", "3");
  t.member("b.jpg", jpeg(2));
  t.member("b.txt", "hi hi hi hi hi");    // 9 tokens + 2 specials: cut to 4 + 2
  t.member("b.json", R"({"meta": {}})");  // the default
  t.member("b.cls", "4");
  t.member("stray.md", "not a sample");
  const std::string shard = write_file("a.tar", t.finish());
  Fixture fx;
  ImageTextSource s({shard}, fx.options());
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(s.fields().size(), 5u);
  EXPECT_EQ(s.fields()[0].shape, (std::vector<int64_t>{8, 8, 3}));
  EXPECT_EQ(s.fields()[2].name, "attention_mask");
  EXPECT_EQ(s.fields()[3].shape, std::vector<int64_t>{});
  EXPECT_EQ(s.path(1), shard + ":b");
  EXPECT_EQ(s.shards(), std::vector<uint64_t>{2});
  const Read a = read_sample(s, 0);
  EXPECT_EQ(a.values<int64_t>(1), (std::vector<int64_t>{10, 6, 8, 11, 11, 11}));
  EXPECT_EQ(a.values<int64_t>(2), (std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(a.values<float>(3), std::vector<float>{0.25f});
  EXPECT_EQ(a.values<int64_t>(4), std::vector<int64_t>{3});
  const Read b = read_sample(s, 1);
  EXPECT_EQ(b.values<int64_t>(1), (std::vector<int64_t>{10, 6, 2, 6, 2, 11}));  // </s> kept
  EXPECT_EQ(b.values<int64_t>(2), (std::vector<int64_t>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(b.values<float>(3), std::vector<float>{-1.0f});
  EXPECT_NE(a.slots[0], b.slots[0]);
}

TEST(ImageTextSource, AMissingMemberIsAnErrorOrACountedSkip) {
  TarWriter t;
  t.member("a.jpg", jpeg(1));
  t.member("a.txt", "hi");
  t.member("a.json", "{}");
  t.member("a.cls", "0");
  t.member("b.jpg", jpeg(2));
  t.member("b.cls", "1");
  const std::string shard = write_file("missing.tar", t.finish());
  Fixture fx;
  const std::string e = error_of([&] { ImageTextSource s({shard}, fx.options()); });
  EXPECT_NE(e.find("tar shard " + shard +
                   ": key 'b' has no .txt member (field 'input_ids'); "
                   "no .json member (field 'similarity')"),
            std::string::npos)
      << e;
  Options o = fx.options();
  o.skip_missing = true;
  ImageTextSource s({shard}, o);
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.stats().keys, 2u);
  EXPECT_EQ(s.stats().skipped_keys, 1u);
  ASSERT_EQ(s.stats().skipped_examples.size(), 1u);
  EXPECT_NE(s.stats().skipped_examples[0].find(shard + ":b: no .txt member"), std::string::npos);
}

TEST(ImageTextSource, BadMembersAreTypedErrors) {
  TarWriter t;
  const char* captions[] = {"hi", "hi", "hi", "hi", "hi \xff\xfe"};
  const char* jsons[] = {R"({"meta": {"similarity": 1}})", "{}", "{not json",
                         R"({"meta": {"similarity": "high"}})", "{}"};
  for (int i = 0; i < 5; ++i) {
    const std::string k = "k" + std::to_string(i);
    t.member(k + ".jpg", jpeg(i));
    t.member(k + ".txt", captions[i]);
    t.member(k + ".json", jsons[i]);
    t.member(k + ".cls", "1");
  }
  const std::string shard = write_file("bad.tar", t.finish());
  Fixture fx;
  ImageTextSource s({shard}, fx.options());
  EXPECT_NO_THROW(read_sample(s, 0));
  EXPECT_NO_THROW(read_sample(s, 1));            // the default
  EXPECT_THROW(read_sample(s, 4), DecodeError);  // not UTF-8
  EXPECT_THROW(read_sample(s, 2), DecodeError);  // not JSON
  EXPECT_NE(
      error_of([&] { read_sample(s, 3); }).find("'meta.similarity' is \"high\", not a number"),
      std::string::npos);
  Options o = fx.options();
  o.fields[2].has_default = false;
  ImageTextSource strict({shard}, o);
  EXPECT_NE(error_of([&] { read_sample(strict, 1); }).find("has no 'meta.similarity'"),
            std::string::npos);
}

TEST(ImageTextSource, NpyMembersKeepTheFirstSamplesDtypeAndShape) {
  TarWriter t;
  t.member("a.npy", npy({1, 2}, "(2,)"));
  t.member("b.npy", npy({3, 4}, "(2,)"));
  t.member("c.npy", npy({5, 6, 7}, "(3,)"));
  const std::string shard = write_file("npy.tar", t.finish());
  Options o;
  FieldOptions f;
  f.kind = FieldKind::kNpy;
  f.name = "embedding";
  f.exts = {"npy"};
  o.fields = {f};
  ImageTextSource s({shard}, o);
  EXPECT_EQ(s.fields()[0].shape, std::vector<int64_t>{2});
  EXPECT_EQ(read_sample(s, 1).values<float>(0), (std::vector<float>{3, 4}));
  EXPECT_NE(error_of([&] { read_sample(s, 2); }).find("shape (3), but the first sample's is"),
            std::string::npos);
}

TEST(ImageTextSource, ConcurrentReadsEachWithItsWorkerStateEqualOneByOne) {
  TarWriter t;
  for (int i = 0; i < 16; ++i) {
    std::string k = std::to_string(i);
    k.insert(0, 1, 'k');  // not "k" + ...: GCC 12's -Wrestrict misfires on it
    t.member(k + ".jpg", jpeg(i));
    t.member(k + ".txt", std::string(static_cast<size_t>(i % 5) + 1, 'h') + " you");
    t.member(k + ".json", R"({"meta": {"similarity": )" + std::to_string(i) + "}}");
    t.member(k + ".cls", std::to_string(i));
  }
  const std::string shard = write_file("threads.tar", t.finish());
  Fixture fx;
  ImageTextSource s({shard}, fx.options());
  std::vector<Read> want;
  for (uint64_t i = 0; i < s.size(); ++i) want.push_back(read_sample(s, i));
  std::vector<std::vector<Read>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      const auto state = s.make_worker_state();
      for (uint64_t i = 0; i < s.size(); ++i) {
        Read r;
        std::vector<std::byte*> ptrs;
        for (const FieldSpec& f : s.fields()) r.slots.emplace_back(f.sample_bytes());
        for (auto& v : r.slots) ptrs.push_back(v.data());
        s.read({0, 0, i}, ptrs, state.get());
        got[t].push_back(std::move(r));
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& reads : got)
    for (uint64_t i = 0; i < s.size(); ++i) EXPECT_EQ(reads[i].slots, want[i].slots) << i;
}

std::string jpeg_of(int width, int height, int seed) {
  const auto rgb = image::testing::pattern_rgb(width, height, seed);
  const auto bytes = image::testing::encode_jpeg(rgb.data(), width, height, 3);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(ImageTextSource, ImagesGoToTheNearestAspectBucketWithTheirSizeAndCrop) {
  // Buckets 8x8 (1:1), 8x16 (landscape 2:1), 16x8 (portrait 1:2); uint8 CHW output.
  std::vector<std::shared_ptr<const image::ImagePipeline>> pipelines;
  for (auto [h, w] : {std::pair{8, 8}, {8, 16}, {16, 8}})
    pipelines.push_back(std::make_shared<const image::ImagePipeline>(
        std::vector<image::Transform>{image::CoverCrop(h, w, true)}));
  // (width, height): square, wide 2.4:1, tall 1:1.8, slightly wide 1.2:1, a corrupt image.
  const std::vector<std::pair<int, int>> sizes = {{20, 20}, {48, 20}, {20, 36}, {24, 20}};
  TarWriter t;
  for (size_t i = 0; i < sizes.size(); ++i)
    t.member("k" + std::to_string(i) + ".jpg",
             jpeg_of(sizes[i].first, sizes[i].second, static_cast<int>(i)));
  t.member("k4.jpg", "\xff\xd8 not a jpeg");
  const std::string shard = write_file("buckets.tar", t.finish());
  FieldOptions f;
  f.kind = FieldKind::kImage;
  f.name = "pixel_values";
  f.exts = {"jpg"};
  f.bucket_pipelines = pipelines;
  f.sizes_name = "original_sizes";
  f.crops_name = "crop_top_lefts";
  Options o;
  o.fields = {f};
  ImageTextSource s({shard}, o);
  ASSERT_EQ(s.size(), 5u);
  ASSERT_EQ(s.fields().size(), 3u);
  EXPECT_EQ(s.fields()[0].bucket_shapes,
            (std::vector<std::vector<int64_t>>{{3, 8, 8}, {3, 8, 16}, {3, 16, 8}}));
  EXPECT_EQ(s.fields()[1].name, "original_sizes");
  const std::vector<uint64_t> want_bucket = {0, 1, 2, 0, 0};
  for (uint64_t i = 0; i < s.size(); ++i) EXPECT_EQ(s.bucket(i), want_bucket[i]) << i;
  EXPECT_EQ(s.image_sizes()[1], (ImageSize{20, 48}));
  EXPECT_EQ(s.image_sizes()[4], (ImageSize{0, 0}));
  for (uint64_t i = 0; i < 4; ++i) {
    const auto& shape = s.fields()[0].bucket_shapes[s.bucket(i)];
    std::vector<std::byte> pixels(3 * shape[1] * shape[2]);
    int64_t hw[2], tl[2];
    std::byte* slots[3] = {pixels.data(), reinterpret_cast<std::byte*>(hw),
                           reinterpret_cast<std::byte*>(tl)};
    s.read({7, 1, i}, slots, nullptr);
    EXPECT_EQ(hw[0], sizes[i].second);
    EXPECT_EQ(hw[1], sizes[i].first);
    // The crop lies inside the image resized to cover the bucket.
    const image::CoverCrop c(static_cast<int>(shape[1]), static_cast<int>(shape[2]), true);
    SampleRng rng(7, 1, i);
    const image::CoverBox box =
        image::cover_crop_params(static_cast<int>(hw[0]), static_cast<int>(hw[1]), c, rng);
    EXPECT_EQ(tl[0], box.top);
    EXPECT_EQ(tl[1], box.left);
    EXPECT_LE(box.top + c.height, box.resized_height);
    EXPECT_LE(box.left + c.width, box.resized_width);
    EXPECT_TRUE(box.resized_height == c.height || box.resized_width == c.width);
  }
  std::vector<std::byte> pixels(3 * 8 * 8);
  int64_t hw[2], tl[2];
  std::byte* slots[3] = {pixels.data(), reinterpret_cast<std::byte*>(hw),
                         reinterpret_cast<std::byte*>(tl)};
  EXPECT_THROW(s.read({0, 0, 4}, slots, nullptr), DecodeError);
  // A transform after the crop that changes the size is refused.
  f.bucket_pipelines = {std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::CoverCrop(8, 8), image::CenterCrop(4)})};
  o.fields = {f};
  EXPECT_THROW(ImageTextSource({shard}, o), InvalidArgument);
}

// A Qwen2-VL field: ragged patches whose count (the sample's length) comes from the image's
// header, the same the read writes (the processor's own output for the decoded image), and the
// grid; a JPEG cut short keeps its header but fails when read.
TEST(ImageTextSource, PatchesAreRaggedWithTheLengthTheHeaderGives) {
  PatchProcessorOptions po;
  po.min_pixels = 4 * 28 * 28;
  po.max_pixels = 16 * 28 * 28;
  auto proc = std::make_shared<const PatchProcessor>(po);
  TarWriter t;
  std::vector<std::string> images;
  const int sizes[][2] = {{16, 16}, {90, 40}, {200, 150}};
  for (int i = 0; i < 3; ++i) {
    const auto rgb = image::testing::pattern_rgb(sizes[i][0], sizes[i][1], i);
    const auto b = image::testing::encode_jpeg(rgb.data(), sizes[i][0], sizes[i][1], 3);
    images.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  }
  images.push_back(images[2].substr(0, images[2].size() / 3));
  images.push_back("not an image");
  for (size_t i = 0; i < images.size(); ++i) {
    t.member("k" + std::to_string(i) + ".jpg", images[i]);
    t.member("k" + std::to_string(i) + ".cls", std::to_string(i));
  }
  Options o;
  FieldOptions f;
  f.kind = FieldKind::kPatches;
  f.name = "pixel_values";
  f.exts = {"jpg"};
  f.patches = proc;
  f.grid_name = "image_grid_thw";
  FieldOptions label;
  label.kind = FieldKind::kLabel;
  label.name = "labels";
  label.exts = {"cls"};
  o.fields = {f, label};
  const ImageTextSource s({write_file("patches.tar", t.finish())}, o);
  ASSERT_EQ(s.fields().size(), 3u);
  EXPECT_TRUE(s.fields()[0].ragged);
  EXPECT_EQ(s.fields()[0].shape, (std::vector<int64_t>{proc->max_patches(), proc->patch_dim()}));
  EXPECT_EQ(s.fields()[1].name, "image_grid_thw");
  for (uint64_t i = 0; i < 3; ++i) {
    const PatchGrid g = proc->grid(sizes[i][1], sizes[i][0]);
    ASSERT_EQ(s.length(i), static_cast<uint64_t>(g.patches())) << i;
    const Read r = read_sample(s, i);
    EXPECT_EQ(r.values<int64_t>(1), (std::vector<int64_t>{g.t, g.h, g.w}));
    const auto img = image::decode(std::as_bytes(std::span(images[i].data(), images[i].size())));
    std::vector<float> want(static_cast<size_t>(g.patches() * proc->patch_dim()));
    std::vector<uint8_t> scratch;
    proc->process(img.rgb, img.width, img.height, want, scratch);
    const auto got = r.values<float>(0);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << i;
  }
  EXPECT_EQ(s.length(3), s.length(2));  // the header survives the cut
  EXPECT_THROW(read_sample(s, 3), DecodeError);
  // No header: the longest a sample can be, so that any replacement fits its batch.
  EXPECT_EQ(s.length(4), static_cast<uint64_t>(proc->max_patches()));
  EXPECT_THROW(read_sample(s, 4), DecodeError);
  FieldOptions twice = f;
  twice.name = "more";
  twice.grid_name = "more_grid";
  o.fields.push_back(twice);
  EXPECT_NE(error_of([&] {
              ImageTextSource({test_dir().path("patches.tar")}, o);
            }).find("one field of patches"),
            std::string::npos);
}

}  // namespace
}  // namespace stoker::image_text
