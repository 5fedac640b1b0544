#include "stoker/sources/document_source.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "stoker/budget.h"
#include "stoker/engine.h"
#include "stoker/testing/test_documents.h"

namespace stoker {
namespace {

std::shared_ptr<testing::VectorDocuments> corpus(uint64_t n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> docs(n);
  for (uint64_t d = 0; d < n; ++d) {
    docs[d].resize(rng() % 40);  // empty documents too
    for (uint64_t t = 0; t < docs[d].size(); ++t) docs[d][t] = static_cast<int64_t>(d * 1000 + t);
  }
  return std::make_shared<testing::VectorDocuments>(std::move(docs));
}

TEST(DocumentSource, ASampleIsADocumentWithItsNextTokens) {
  auto docs = corpus(30);
  const DocumentSource src(docs, 7, -100, 0);
  ASSERT_EQ(src.size(), 30u);
  ASSERT_TRUE(src.fields()[0].ragged && src.fields()[1].ragged);
  for (uint64_t d = 0; d < 30; ++d) {
    const uint64_t n = docs->document_length(d);
    ASSERT_EQ(src.length(d), n);
    std::vector<int64_t> ids(n + 1, 1), labels(n + 1, 1);
    std::byte* slots[] = {reinterpret_cast<std::byte*>(ids.data()),
                          reinterpret_cast<std::byte*>(labels.data())};
    src.read({0, 0, d}, slots, nullptr);
    for (uint64_t t = 0; t < n; ++t) {
      EXPECT_EQ(ids[t], static_cast<int64_t>(d * 1000 + t));
      EXPECT_EQ(labels[t], t + 1 < n ? ids[t] + 1 : -100);
    }
    EXPECT_EQ(ids[n], 1) << "nothing written past the sample's length";
  }
}

TEST(DocumentSource, ATruncatedDocumentKeepsTheTokenAfterTheCutAsItsLastLabel) {
  auto docs = corpus(10, 3);
  const DocumentSource src(docs, 0, -100, 5);
  for (uint64_t d = 0; d < 10; ++d) {
    const uint64_t n = docs->document_length(d);
    ASSERT_EQ(src.length(d), std::min<uint64_t>(n, 5));
    if (n <= 5) continue;
    std::vector<int64_t> ids(5), labels(5);
    std::byte* slots[] = {reinterpret_cast<std::byte*>(ids.data()),
                          reinterpret_cast<std::byte*>(labels.data())};
    src.read({0, 0, d}, slots, nullptr);
    EXPECT_EQ(labels[4], static_cast<int64_t>(d * 1000 + 5));
  }
}

TEST(DocumentSource, EveryTokenOnceAnEpochInBudgetBatches) {
  auto docs = corpus(500, 5);
  auto src = std::make_shared<DocumentSource>(docs, 0, -100, 0);
  std::vector<double> lengths(src->size());
  for (uint64_t d = 0; d < src->size(); ++d) lengths[d] = static_cast<double>(src->length(d));
  BudgetOptions bo;
  bo.budget = 256;
  EngineOptions o;
  o.shuffle = true;
  o.num_workers = 2;
  o.pad_to_multiple_of = 8;
  o.budget = std::make_shared<const BudgetPlan>(lengths, bo);
  Engine loader(src, o);
  auto it = loader.iterate(1);
  std::map<int64_t, int> tokens;
  while (auto b = it->next()) {
    const int64_t padded = b->fields[0].shape[1];
    const auto* ids = reinterpret_cast<const int64_t*>(b->fields[0].data);
    const auto* lens = reinterpret_cast<const int64_t*>(b->fields[2].data);
    for (uint64_t s = 0; s < b->length; ++s)
      for (int64_t t = 0; t < lens[s]; ++t) ++tokens[ids[s * padded + t]];
  }
  EXPECT_EQ(tokens.size(), docs->num_tokens());
  for (const auto& [token, count] : tokens) ASSERT_EQ(count, 1) << token;
}

}  // namespace
}  // namespace stoker
