#include "stoker/sources/image_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/test_temp_dir.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

// A minimal tar writer: ustar headers with correct checksums, for tests only.
class TarWriter {
 public:
  void member(const std::string& name, const std::string& data, char type = '0',
              const std::string& prefix = "") {
    std::string h(512, '\0');
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(h.data() + 100, 8, "%07o", 0644);
    std::snprintf(h.data() + 108, 8, "%07o", 0);
    std::snprintf(h.data() + 116, 8, "%07o", 0);
    std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
    std::snprintf(h.data() + 136, 12, "%011o", 0);
    h[156] = type;
    std::memcpy(h.data() + 257, "ustar\0", 6);
    std::memcpy(h.data() + 263, "00", 2);
    std::memcpy(h.data() + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
    std::memset(h.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(h.data() + 148, 8, "%06o", sum);
    h[155] = ' ';
    bytes_ += h;
    bytes_ += data;
    bytes_.append((512 - data.size() % 512) % 512, '\0');
  }
  void long_name(const std::string& name, const std::string& data) {
    member("././@LongLink", name + '\0', 'L');
    member(name.substr(0, 99), data);
  }
  void pax_path(const std::string& name, const std::string& data) {
    std::string record = " path=" + name + "\n";
    size_t len = record.size() + 1;
    while (std::to_string(len).size() + record.size() != len) ++len;
    member("PaxHeaders/x", std::to_string(len) + record, 'x');
    member("placeholder-name.bin", data);
  }
  std::string finish() { return bytes_ + std::string(1024, '\0'); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// The test's files, in a directory of its own removed when the test program exits (ctest runs
// each test in a process of its own).
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

std::string read_string(const ImageFiles& files, uint64_t i) {
  std::vector<std::byte> buf;
  files.read(i, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size());
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

TEST(TarShardFiles, IndexesKeysInMemberOrderWithLongNamesPaxAndDirectories) {
  const std::string long_dir(120, 'd');
  TarWriter t;
  t.member("dir/", "", '5');
  t.member("a/x001.jpg", "JPEG-001");
  t.member("a/x001.cls", " 3\n");
  t.member("a/x001.json", "{}");
  t.long_name(long_dir + "/x002.JPEG", "JPEG-002");
  t.long_name(long_dir + "/x002.cls", "7");
  t.member("pax/x003.cls", "-2");  // label before image
  t.pax_path("pax/x003.png", "PNG-003");
  t.member("link.jpg", "", '2');                 // symlink: skipped
  t.member("only.json", "{}");                   // no image, no label: not a sample
  t.member("x004.jpg", "JPEG-004", '0', "pre");  // ustar prefix
  t.member("pre/x004.cls", "12");
  const std::string shard = write_file("index.tar", t.finish());
  TarShardFiles files({shard});
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files.label(0), 3);
  EXPECT_EQ(files.label(1), 7);
  EXPECT_EQ(files.label(2), -2);
  EXPECT_EQ(files.label(3), 12);
  EXPECT_EQ(read_string(files, 0), "JPEG-001");
  EXPECT_EQ(read_string(files, 1), "JPEG-002");
  EXPECT_EQ(read_string(files, 2), "PNG-003");
  EXPECT_EQ(read_string(files, 3), "JPEG-004");
  EXPECT_EQ(files.path(0), shard + ":a/x001.jpg");
  EXPECT_EQ(files.path(1), shard + ":" + long_dir + "/x002.JPEG");
  EXPECT_EQ(files.path(2), shard + ":pax/x003.png");
  EXPECT_EQ(files.path(3), shard + ":pre/x004.jpg");
}

TEST(TarShardFiles, SamplesFollowShardOrder) {
  TarWriter a, b;
  b.member("k1.jpg", "B1");
  b.member("k1.cls", "1");
  a.member("k2.jpg", "A2");
  a.member("k2.cls", "2");
  a.member("k3.jpg", "A3");
  a.member("k3.cls", "3");
  const std::string pa = write_file("a.tar", a.finish()), pb = write_file("b.tar", b.finish());
  TarShardFiles files({pb, pa});
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files.num_shards(), 2u);
  EXPECT_EQ(read_string(files, 0), "B1");
  EXPECT_EQ(read_string(files, 1), "A2");
  EXPECT_EQ(read_string(files, 2), "A3");
  EXPECT_EQ(files.label(2), 3);
}

TEST(TarShardFiles, KeyWithoutLabelNamesShardAndMember) {
  TarWriter t;
  t.member("ok.jpg", "x");
  t.member("ok.cls", "0");
  t.member("lonely.jpg", "x");
  const std::string shard = write_file("nolabel.tar", t.finish());
  const std::string msg = error_of([&] { TarShardFiles files({shard}); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("lonely.jpg"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no label"), std::string::npos) << msg;
  EXPECT_THROW(TarShardFiles({shard}), InvalidArgument);
}

TEST(TarShardFiles, InvalidLabelAndMissingImageAreClearErrors) {
  TarWriter bad;
  bad.member("k.jpg", "x");
  bad.member("k.cls", "dog");
  const std::string p1 = write_file("badlabel.tar", bad.finish());
  const std::string m1 = error_of([&] { TarShardFiles files({p1}); });
  EXPECT_NE(m1.find("k.cls"), std::string::npos) << m1;
  EXPECT_NE(m1.find("invalid label 'dog'"), std::string::npos) << m1;

  TarWriter noimg;
  noimg.member("k.txt", "caption");
  noimg.member("k.cls", "1");
  const std::string p2 = write_file("noimage.tar", noimg.finish());
  const std::string m2 = error_of([&] { TarShardFiles files({p2}); });
  EXPECT_NE(m2.find(p2), std::string::npos) << m2;
  EXPECT_NE(m2.find("no image"), std::string::npos) << m2;
}

TEST(TarShardFiles, TruncatedAndCorruptTarsAreClearErrors) {
  TarWriter t;
  t.member("k.jpg", std::string(3000, 'j'));
  t.member("k.cls", "1");
  const std::string full = t.finish();
  // Cut inside the image's data.
  const std::string p1 = write_file("truncated.tar", full.substr(0, 512 + 1000));
  const std::string m1 = error_of([&] { TarShardFiles files({p1}); });
  EXPECT_NE(m1.find(p1), std::string::npos) << m1;
  EXPECT_NE(m1.find("truncated"), std::string::npos) << m1;
  EXPECT_NE(m1.find("k.jpg"), std::string::npos) << m1;
  // Cut inside a header.
  const std::string p2 = write_file("truncated2.tar", full.substr(0, 512 + 3072 + 100));
  EXPECT_NE(error_of([&] { TarShardFiles files({p2}); }).find("partial header"), std::string::npos);
  // Not a tar at all.
  const std::string p3 = write_file("garbage.tar", std::string(2048, 'z'));
  const std::string m3 = error_of([&] { TarShardFiles files({p3}); });
  EXPECT_NE(m3.find("checksum"), std::string::npos) << m3;
  // Missing shard.
  EXPECT_THROW(TarShardFiles({"/nonexistent/shard.tar"}), IoError);
}

TEST(TarShardSet, IndexesEveryKeyWithItsMembersByExtension) {
  TarWriter t;
  t.member("a.jpg", "IMG");
  t.member("a.txt", "a caption");
  t.member("dir", "", '5');
  t.member("b.Seg.PNG", "PNG");
  t.member("a.json", "{}");
  t.member("README", "no extension");
  t.member("./b.txt", "bee");
  const std::string p = write_file("keys.tar", t.finish());
  TarShardSet set({p});
  const std::vector<TarKey> keys = set.index(0);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].key, "a");
  ASSERT_EQ(keys[0].members.size(), 3u);
  EXPECT_EQ(keys[0].members[0].ext, "jpg");
  EXPECT_EQ(keys[0].members[1].ext, "txt");
  EXPECT_EQ(keys[0].members[2].ext, "json");
  EXPECT_EQ(keys[1].key, "b");
  ASSERT_EQ(keys[1].members.size(), 2u);
  EXPECT_EQ(keys[1].members[0].ext, "seg.png");  // lowercased, from the basename's first '.'
  EXPECT_EQ(keys[1].members[1].name, "b.txt");
  std::vector<std::byte> buf;
  const TarEntry& caption = keys[0].members[1];
  set.read(0, caption.offset, caption.size, buf, "a.txt");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf.data()), buf.size()), "a caption");
  int64_t label = 0;
  EXPECT_TRUE(parse_tar_label(" -12\n", &label));
  EXPECT_EQ(label, -12);
  EXPECT_FALSE(parse_tar_label("1.5", &label));
  EXPECT_NE(error_of([] { TarShardSet({"/nonexistent/x.tar"}); }).find("cannot open tar shard"),
            std::string::npos);
}

TEST(ImageFiles, AFifoInAFilesPlaceFailsInsteadOfBlocking) {
  // A FIFO with no writer: open() without O_NONBLOCK would wait for one forever.
  const std::string fifo = test_dir().path("fifo.jpg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ImageFolderFiles files({{fifo, 0}});
  std::vector<std::byte> buf;
  EXPECT_EQ(error_of([&] { files.read(0, buf); }), "cannot read " + fifo + ": not a regular file");
  EXPECT_EQ(error_of([&] { TarShardFiles shards({fifo}); }),
            "cannot read tar shard " + fifo + ": not a regular file");
}

TEST(ImageFolderFiles, ReadsBytesAndNamesMissingFiles) {
  const std::string p = write_file("folder_a.jpg", std::string("\xff\xd8hello", 7));
  ImageFolderFiles files({{p, 4}, {"/nonexistent/b.jpg", 1}});
  EXPECT_EQ(files.size(), 2u);
  EXPECT_EQ(files.label(0), 4);
  EXPECT_EQ(read_string(files, 0), std::string("\xff\xd8hello", 7));
  std::vector<std::byte> buf(100);
  files.read(0, buf);
  EXPECT_EQ(buf.size(), 7u);  // replaced, not appended
  const std::string msg = error_of([&] { files.read(1, buf); });
  EXPECT_NE(msg.find("/nonexistent/b.jpg"), std::string::npos) << msg;
  EXPECT_THROW(files.read(1, buf), IoError);
}

}  // namespace
}  // namespace stoker
