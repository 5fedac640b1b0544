#include "stoker/sources/array_documents.h"

#include <gtest/gtest.h>

#include <vector>

#include "stoker/errors.h"

namespace stoker {
namespace {

constexpr DType kInt32{DType::kInt, 32};
constexpr DType kUInt16{DType::kUInt, 16};

TEST(ArrayDocuments, RowsAreDocumentsReadInPlace) {
  const std::vector<uint16_t> values{9, 1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> offsets{1, 3, 3, 7};  // a sliced column: rows start at value 1
  const ArrayDocuments docs(values.data(), kUInt16, values.size(), offsets.data(), kInt32, 3,
                            "t:ids", 0, nullptr);
  ASSERT_EQ(docs.num_documents(), 3u);
  EXPECT_EQ(docs.num_tokens(), 6u);
  EXPECT_EQ(docs.document_length(0), 2u);
  EXPECT_EQ(docs.document_length(1), 0u);
  std::vector<int64_t> out(3);
  docs.read(2, 1, 3, out.data());
  EXPECT_EQ(out, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(docs.path(2), "t:ids");
}

TEST(ArrayDocuments, BadOffsetsAndIdsAreNamed) {
  const std::vector<int32_t> values{1, -2, 3};
  const std::vector<int64_t> down{0, 2, 1}, past{0, 4}, ok{0, 3};
  EXPECT_THROW(ArrayDocuments(values.data(), kInt32, 3, down.data(), kInt64, 2, "c", 0, nullptr),
               InvalidArgument);
  EXPECT_THROW(ArrayDocuments(values.data(), kInt32, 3, past.data(), kInt64, 1, "c", 0, nullptr),
               InvalidArgument);
  EXPECT_THROW(ArrayDocuments(values.data(), kFloat32, 3, ok.data(), kInt64, 1, "c", 0, nullptr),
               InvalidArgument);
  const ArrayDocuments docs(values.data(), kInt32, 3, ok.data(), kInt64, 1, "c", 3, nullptr);
  std::vector<int64_t> out(3);
  try {
    docs.read(0, 0, 3, out.data());
    FAIL() << "a negative id was read";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "c: row 0, token 1: negative token id -2");
  }
  const std::vector<int32_t> big{1, 3};
  const std::vector<int64_t> two{0, 2};
  const ArrayDocuments vocab(big.data(), kInt32, 2, two.data(), kInt64, 1, "v", 3, nullptr);
  EXPECT_THROW(vocab.read(0, 0, 2, out.data()), InvalidArgument);
}

}  // namespace
}  // namespace stoker
