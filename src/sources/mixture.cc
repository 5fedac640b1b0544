#include "stoker/sources/mixture.h"

#include <algorithm>

#include "stoker/mixture.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

struct MixtureWorkerState final : WorkerState {
  std::vector<std::unique_ptr<WorkerState>> states;  // per source, made at its first read
  std::vector<bool> made;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

MixtureSource::MixtureSource(std::vector<std::shared_ptr<const Source>> sources,
                             std::vector<std::string> names)
    : sources_(std::move(sources)), names_(std::move(names)) {
  if (sources_.empty()) throw InvalidArgument("a mixture needs at least one source");
  if (names_.size() != sources_.size())
    throw InvalidArgument(
        "a mixture needs one name per source: " + std::to_string(sources_.size()) + " sources, " +
        std::to_string(names_.size()) + " names");
  for (size_t c = 0; c < sources_.size(); ++c)
    if (!sources_[c]) throw InvalidArgument("mixture source \"" + names_[c] + "\" is null");
  const std::vector<FieldSpec>& first = sources_[0]->fields();
  for (size_t c = 1; c < sources_.size(); ++c) {
    const std::vector<FieldSpec>& f = sources_[c]->fields();
    const std::string who = "mixture source \"" + names_[c] + "\"";
    const std::string ref = " than \"" + names_[0] + "\"";
    if (f.size() != first.size())
      throw InvalidArgument(who + " has " + std::to_string(f.size()) + " fields, \"" + names_[0] +
                            "\" has " + std::to_string(first.size()) +
                            "; mixed sources need the same fields");
    for (size_t i = 0; i < f.size(); ++i) {
      const std::string field = " field " + std::to_string(i) + " (\"" + first[i].name + "\")";
      if (f[i].name != first[i].name)
        throw InvalidArgument(who + field + " is named \"" + f[i].name + "\" in it; mixed " +
                              "sources need the same fields");
      if (!(f[i].dtype == first[i].dtype))
        throw InvalidArgument(who + field + " has dtype " + f[i].dtype.name() + ", \"" + names_[0] +
                              "\"'s has " + first[i].dtype.name());
      if (f[i].shape != first[i].shape)
        throw InvalidArgument(who + field + " has shape " + shape_text(f[i].shape) + ", \"" +
                              names_[0] + "\"'s has " + shape_text(first[i].shape));
    }
  }
  offsets_.push_back(0);
  for (const auto& s : sources_) offsets_.push_back(offsets_.back() + s->size());
  size_ = offsets_.back();
}

std::vector<uint64_t> MixtureSource::sizes() const {
  std::vector<uint64_t> out;
  for (const auto& s : sources_) out.push_back(s->size());
  return out;
}

std::pair<uint64_t, uint64_t> MixtureSource::locate(uint64_t index) const {
  // The last source starting at or before index (an empty source starts where the next does).
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end() - 1, index) - 1;
  const auto c = static_cast<uint64_t>(it - offsets_.begin());
  return {c, index - *it};
}

void MixtureSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                         WorkerState* state) const {
  const auto [c, j] = locate(key.index);
  WorkerState* inner = nullptr;
  std::unique_ptr<WorkerState> once;  // a read without a worker's state (one sample, inspected)
  if (auto* mine = static_cast<MixtureWorkerState*>(state)) {
    if (!mine->made[c]) {
      mine->states[c] = sources_[c]->make_worker_state();
      mine->made[c] = true;
    }
    inner = mine->states[c].get();
  } else {
    once = sources_[c]->make_worker_state();
    inner = once.get();
  }
  sources_[c]->read({mixture_source_seed(key.seed, c), key.epoch, j}, slots, inner);
}

std::string MixtureSource::path(uint64_t index) const {
  if (index >= size_) return {};
  const auto [c, j] = locate(index);
  std::string p = sources_[c]->path(j);
  return names_[c] + ": " + (p.empty() ? "sample " + std::to_string(j) : p);
}

void MixtureSource::prefetch(uint64_t index) const {
  if (index >= size_) return;
  const auto [c, j] = locate(index);
  sources_[c]->prefetch(j);
}

void MixtureSource::prefetch_batch(std::span<const uint64_t> indices) const {
  // Each source gets its own samples, in batch order. A hint: an allocation that fails is
  // ignored.
  try {
    thread_local std::vector<uint64_t> mine;
    for (size_t c = 0; c < sources_.size(); ++c) {
      mine.clear();
      for (uint64_t i : indices)
        if (i >= offsets_[c] && i < offsets_[c + 1]) mine.push_back(i - offsets_[c]);
      if (!mine.empty()) sources_[c]->prefetch_batch(mine);
    }
  } catch (...) {
  }
}

std::unique_ptr<WorkerState> MixtureSource::make_worker_state() const {
  auto state = std::make_unique<MixtureWorkerState>();
  state->states.resize(sources_.size());
  state->made.assign(sources_.size(), false);
  return state;
}

}  // namespace stoker
