// stoker._native.remote: the shard cache of remote datasets (stoker/shard_cache.h) and the
// remote forms of the native sources that read through it. The network is the Python front's
// (stoker/remote): its fetcher threads call next_request() and fetched() / failed().
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/mapped_file.h"
#include "stoker/shard_cache.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/megatron.h"
#include "stoker/sources/token_corpus.h"
#include "stoker/sources/tokens.h"

namespace stoker::python {

namespace {

nb::dict stats_dict(const ShardCacheStats& s) {
  nb::dict d;
  d["shards"] = s.shards;
  d["fetched"] = s.fetched;
  d["disk_hits"] = s.disk_hits;
  d["reuses"] = s.reuses;
  d["ahead"] = s.ahead;
  d["misses"] = s.misses;
  d["failures"] = s.failures;
  d["evictions"] = s.evictions;
  d["bytes_fetched"] = s.bytes_fetched;
  d["fetch_seconds"] = s.fetch_seconds;
  d["network_seconds"] = s.network_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["bytes_on_disk"] = s.bytes_on_disk;
  d["peak_bytes_on_disk"] = s.peak_bytes_on_disk;
  d["budget"] = s.budget;
  return d;
}

using MemberTuple = std::tuple<std::string, uint64_t, uint64_t, int64_t>;

// The integer dtypes token shards hold (flat: uint16/uint32; Megatron: any integer).
DType token_dtype_of(const std::string& name) {
  for (const uint8_t bits : {8, 16, 32, 64})
    for (const DType::Code code : {DType::kInt, DType::kUInt})
      if (DType{code, bits}.name() == name) return {code, bits};
  throw InvalidArgument("not an integer dtype: \"" + name + "\"");
}

TokenCorpus::Format format_of(const std::string& name) {
  if (name == "raw") return TokenCorpus::Format::kRaw;
  if (name == "llm.c") return TokenCorpus::Format::kLlmc;
  if (name == "npy") return TokenCorpus::Format::kNpy;
  if (name == "megatron") return TokenCorpus::Format::kMegatron;
  throw InvalidArgument("unknown token file format \"" + name + "\"");
}

}  // namespace

void register_remote(nb::module_& m) {
  nb::class_<ShardCache>(m, "ShardCache")
      .def(nb::new_(
               [](const std::vector<std::pair<std::string, uint64_t>>& shards, uint64_t budget) {
                 std::vector<ShardCache::Shard> v;
                 v.reserve(shards.size());
                 for (const auto& [url, size] : shards) v.push_back({url, size});
                 return std::make_shared<ShardCache>(std::move(v), budget);
               }),
           nb::arg("shards"), nb::arg("budget"), "shards: (url, size in bytes) pairs.")
      .def("__len__", &ShardCache::size)
      .def("schedule", &ShardCache::schedule, nb::arg("order"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "next_request",
          [](ShardCache& c,
             double timeout) -> std::optional<std::tuple<uint32_t, std::string, uint64_t>> {
            std::optional<ShardCache::Request> r;
            {
              nb::gil_scoped_release release;
              r = c.next_request(timeout);
            }
            if (!r) return std::nullopt;
            return std::make_tuple(r->shard, r->url, r->size);
          },
          nb::arg("timeout"),
          "(shard, url, size) to fetch next, or None after `timeout` seconds or once closed.")
      .def("fetched", &ShardCache::fetched, nb::arg("shard"), nb::arg("path"), nb::arg("hit"),
           nb::arg("bytes"), nb::arg("seconds"), nb::call_guard<nb::gil_scoped_release>())
      .def("failed", &ShardCache::failed, nb::arg("shard"), nb::arg("message"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "acquire",
          [](ShardCache& c, uint32_t s) {
            if (s >= c.size()) throw nb::index_error("shard out of range");
            nb::gil_scoped_release release;
            c.acquire(s);
          },
          nb::arg("shard"), "Waits until shard `shard` is local (for tests and tools).")
      .def("close", &ShardCache::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", &ShardCache::closed)
      .def("stats", [](const ShardCache& c) { return stats_dict(c.stats()); })
      .def("resident", &ShardCache::resident);

  m.def(
      "tar_shard_files",
      [](std::shared_ptr<ShardCache> cache, std::vector<std::vector<MemberTuple>> index) {
        std::vector<std::vector<TarMember>> members(index.size());
        for (size_t s = 0; s < index.size(); ++s) {
          members[s].reserve(index[s].size());
          for (auto& [name, offset, size, label] : index[s])
            members[s].push_back({std::move(name), offset, size, label});
        }
        return std::make_shared<TarShardFiles>(std::move(cache), std::move(members));
      },
      nb::arg("cache"), nb::arg("index"),
      "TarShardFiles over remote shards: index[s] lists shard s's samples as (image member, "
      "data offset, size, label).");
  m.def(
      "token_file_layout",
      [](nb::bytes head, uint64_t file_size, const std::string& dtype, const std::string& url) {
        const auto* p = static_cast<const std::byte*>(static_cast<const void*>(head.c_str()));
        const TokenFileLayout l =
            parse_token_file({p, head.size()}, file_size, token_dtype_of(dtype), url);
        const char* format = l.format == TokenFileLayout::Format::kLlmc  ? "llm.c"
                             : l.format == TokenFileLayout::Format::kNpy ? "npy"
                                                                         : "raw";
        return std::make_tuple(std::string(format), l.data_offset, l.num_tokens);
      },
      nb::arg("head"), nb::arg("file_size"), nb::arg("dtype"), nb::arg("url"),
      "(format, data offset, tokens) of a token file from its first bytes (at least 1024, or the "
      "whole file) and its size.");
  m.def(
      "megatron_index",
      [](const std::string& idx_path, uint64_t bin_size, const std::string& bin_url) {
        MegatronIndex index;
        {
          nb::gil_scoped_release release;
          const MappedFile idx(idx_path, "Megatron index");
          index = read_megatron_index(idx, bin_size, bin_url);
        }
        return std::make_tuple(index.token_dtype.name(), index.data_offset, index.num_tokens,
                               std::move(index.document_ends));
      },
      nb::arg("idx_path"), nb::arg("bin_size"), nb::arg("bin_url"),
      "(token dtype, data offset, tokens, document ends) from a local copy of a Megatron .idx.");
  m.def(
      "token_corpus",
      [](std::shared_ptr<ShardCache> cache, const nb::list& shards, uint64_t vocab_size) {
        std::vector<TokenCorpus::RemoteShard> v;
        v.reserve(shards.size());
        for (nb::handle h : shards) {
          // (format, dtype, data offset, tokens, ends, last tokens)
          auto t = nb::cast<std::tuple<std::string, std::string, uint64_t, uint64_t,
                                       std::vector<uint64_t>, std::vector<int64_t>>>(h);
          TokenCorpus::RemoteShard r;
          r.format = format_of(std::get<0>(t));
          r.dtype = token_dtype_of(std::get<1>(t));
          r.data_offset = std::get<2>(t);
          r.num_tokens = std::get<3>(t);
          r.ends = std::move(std::get<4>(t));
          r.last_tokens = std::move(std::get<5>(t));
          v.push_back(std::move(r));
        }
        nb::gil_scoped_release release;
        return std::make_shared<TokenCorpus>(std::move(cache), std::move(v), vocab_size);
      },
      nb::arg("cache"), nb::arg("shards"), nb::arg("vocab_size") = 0,
      "A TokenCorpus over remote shards: per shard (format, dtype, data offset, tokens, document "
      "ends or [], last token of each document or []).");
  m.def(
      "index_tar_keys",
      [](const std::string& path) {
        std::vector<TarKey> keys;
        {
          nb::gil_scoped_release release;
          keys = TarShardSet({path}).index(0);
        }
        std::vector<std::tuple<
            std::string, std::vector<std::tuple<std::string, std::string, uint64_t, uint64_t>>>>
            out;
        out.reserve(keys.size());
        for (auto& k : keys) {
          std::vector<std::tuple<std::string, std::string, uint64_t, uint64_t>> members;
          for (auto& e : k.members)
            members.emplace_back(std::move(e.ext), std::move(e.name), e.offset, e.size);
          out.emplace_back(std::move(k.key), std::move(members));
        }
        return out;
      },
      nb::arg("path"),
      "Every key of a local tar shard with its members: (key, [(ext, member, data offset, "
      "size)]), in the order of each key's first member.");
  m.def(
      "index_tar",
      [](const std::string& path, const std::string& media) {
        if (media != "images" && media != "videos")
          throw InvalidArgument("index_tar: media is \"images\" or \"videos\"");
        std::vector<TarMember> members;
        {
          nb::gil_scoped_release release;
          members = TarShardFiles::index_file(
              path, media == "videos" ? TarMedia::kVideos : TarMedia::kImages);
        }
        std::vector<MemberTuple> out;
        out.reserve(members.size());
        for (auto& m : members) out.emplace_back(std::move(m.name), m.offset, m.size, m.label);
        return out;
      },
      nb::arg("path"), nb::arg("media") = "images",
      "The samples of a local tar shard: (image or video member, data offset, size, label).");
}

}  // namespace stoker::python
