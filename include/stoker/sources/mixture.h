// MixtureSource: several sources end to end, read as one (the source of a weighted mixture's
// loader; its order is mixture.h's).
//
// Global sample offset_c + j is source c's sample j (offset_c: the samples of the sources before
// c). Every source has the same fields (name, dtype, shape). read() forwards to the source, with
// the key's seed replaced by mixture_source_seed(seed, c) and index j: a source in a mixture draws
// the randomness it would draw in a loader of its own seeded so (key.epoch is the source's own
// epoch, the draw's cycle). path() names the source: "name: path", or "name: sample j" for a
// source without paths. Per-thread state: one of each source's, made when it first reads.
//
// Thread safety: immutable; read() is safe from any number of threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stoker/source.h"

namespace stoker {

class MixtureSource final : public Source {
 public:
  // REQUIRES (InvalidArgument otherwise): at least one source, none null, one name each; every
  // source with the fields of the first (the message names the source and the field).
  MixtureSource(std::vector<std::shared_ptr<const Source>> sources, std::vector<std::string> names);

  uint64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return sources_[0]->fields(); }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::string path(uint64_t index) const override;
  void prefetch(uint64_t index) const override;
  void prefetch_batch(std::span<const uint64_t> indices) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

  uint64_t num_sources() const { return sources_.size(); }
  const Source& source(uint64_t c) const { return *sources_[c]; }
  const std::string& name(uint64_t c) const { return names_[c]; }
  // Each source's samples.
  std::vector<uint64_t> sizes() const;
  // (source, its sample) of global sample `index`. REQUIRES: index < size().
  std::pair<uint64_t, uint64_t> locate(uint64_t index) const;

 private:
  std::vector<std::shared_ptr<const Source>> sources_;
  std::vector<std::string> names_;
  std::vector<uint64_t> offsets_;  // per source + 1: its first global sample
  uint64_t size_ = 0;
};

}  // namespace stoker
