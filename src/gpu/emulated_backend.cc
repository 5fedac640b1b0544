// The CPU emulation of the GPU stage's device (emulated_backend.h): host memory for device
// memory, libjpeg for nvJPEG, and the kernels' own thread functions run on the host. Everything
// the GPU stage decides (chunks, descriptors, fallbacks, errors, replacement) runs as it does on a
// GPU.
#include "gpu/emulated_backend.h"

#include "stoker/gpu/emulated.h"

#include <cstring>
#include <set>

#include "gpu/render.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"

namespace stoker::image::gpu {
namespace {

namespace k = internal::k;

// One render launch on the host, in the GPU's order (all coefficient threads, then all
// horizontal-pass threads, then all vertical-pass threads).
void render_reference(const k::KParams& p, int32_t max_rows) {
  for (int32_t s = 0; s < p.n; ++s)
    for (int32_t i = 0; i < p.out_w + p.out_h; ++i) k::k_coeff_thread(p, s, i);
  for (int32_t s = 0; s < p.n; ++s)
    for (int32_t r = 0; r < max_rows; ++r)
      for (int32_t x = 0; x < p.out_w; ++x) k::k_hpass_thread(p, s, r, x);
  for (int32_t s = 0; s < p.n; ++s)
    for (int32_t y = 0; y < p.out_h; ++y)
      for (int32_t x = 0; x < p.out_w; ++x) k::k_vpass_thread(p, s, y, x);
}

class EmulatedBackend final : public DecodeBackend {
 public:
  explicit EmulatedBackend(std::vector<uint64_t> reject) : reject_(reject.begin(), reject.end()) {}

  std::string name() const override { return "emulated"; }

  const uint8_t* upload_table(const std::vector<std::byte>& table) override {
    table_.assign(reinterpret_cast<const uint8_t*>(table.data()),
                  reinterpret_cast<const uint8_t*>(table.data()) + table.size());
    return table_.data();
  }

  void begin(uintptr_t) override {}
  uint8_t* arena(size_t bytes) override {
    if (arena_.size() < bytes) arena_.resize(bytes);
    return arena_.data();
  }
  std::byte* host_staging(size_t bytes) override {
    if (staging_.size() < bytes) staging_.resize(bytes);
    return staging_.data();
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  void decode(std::span<const JpegJob> jobs, std::vector<uint8_t>& ok, uint64_t*) override {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const JpegJob& j = jobs[i];
      ok[i] = 0;
      if (reject_.count(j.index)) continue;
      try {
        const DecodedImage img = image::decode({j.data, j.bytes});
        if (img.width != j.width || img.height != j.height) continue;
        for (int y = 0; y < j.height; ++y)
          std::memcpy(j.dst + static_cast<size_t>(y) * j.pitch,
                      img.rgb.data() + static_cast<size_t>(y) * j.width * 3,
                      static_cast<size_t>(j.width) * 3);
        ok[i] = 1;
      } catch (const DecodeError&) {
        // A corrupt file: reported as nvJPEG reports it, by a failed decode.
      }
    }
  }

  void render(const k::KParams& p, int32_t max_rows) override { render_reference(p, max_rows); }
  void end() override {}

  uint64_t device_bytes() const override { return arena_.size() + table_.size(); }
  uint64_t pinned_bytes() const override { return staging_.size(); }

 private:
  std::set<uint64_t> reject_;
  std::vector<uint8_t> arena_, table_;
  std::vector<std::byte> staging_;
};

}  // namespace

std::unique_ptr<DecodeBackend> make_emulated_backend(std::vector<uint64_t> reject) {
  return std::make_unique<EmulatedBackend>(std::move(reject));
}

std::unique_ptr<GpuBatchDecoder> make_emulated_decoder(
    std::shared_ptr<const GpuDecodeSource> source, OnError on_error,
    std::vector<uint64_t> reject) {
  return std::make_unique<GpuBatchDecoder>(std::move(source),
                                           make_emulated_backend(std::move(reject)), on_error);
}

}  // namespace stoker::image::gpu
