#include "stoker/ffmpeg/reader.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "image/decode_region.h"  // scaled_size
#include "image/halve.h"
#include "stoker/errors.h"

namespace stoker::video {
namespace {

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, buf, sizeof buf);
  return buf;
}

std::string at_time(const VideoIndex* index, int64_t ts) {
  if (index == nullptr || ts == AV_NOPTS_VALUE) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " at t=%.3f s", index->seconds(ts));
  return buf;
}

struct FormatCloser {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
struct AvFree {
  void operator()(uint8_t* p) const { av_free(p); }
};

// A video in memory, read by FFmpeg through a custom AVIOContext.
struct MemoryInput {
  std::vector<std::byte> bytes;
  int64_t pos = 0;

  static int read(void* opaque, uint8_t* buf, int size) {
    auto* in = static_cast<MemoryInput*>(opaque);
    const int64_t left = static_cast<int64_t>(in->bytes.size()) - in->pos;
    if (left <= 0) return AVERROR_EOF;
    const int n = static_cast<int>(std::min<int64_t>(left, size));
    std::memcpy(buf, in->bytes.data() + in->pos, static_cast<size_t>(n));
    in->pos += n;
    return n;
  }
  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* in = static_cast<MemoryInput*>(opaque);
    const auto size = static_cast<int64_t>(in->bytes.size());
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE:
        return size;
      case SEEK_SET:
        break;
      case SEEK_CUR:
        offset += in->pos;
        break;
      case SEEK_END:
        offset += size;
        break;
      default:
        return AVERROR(EINVAL);
    }
    if (offset < 0 || offset > size) return AVERROR(EINVAL);
    in->pos = offset;
    return offset;
  }
};

struct IoCloser {
  void operator()(AVIOContext* io) const {
    av_freep(&io->buffer);
    avio_context_free(&io);
  }
};

// A decoded frame as an image::Picture: the rectangle asked for (widened to whole chroma
// samples) converted to RGB24 by libswscale, the same conversion PyAV's to_ndarray() makes.
class FramePicture final : public image::Picture {
 public:
  void reset(const AVFrame* frame, const std::string* path) {
    frame_ = frame;
    path_ = path;
  }
  int width() const override { return frame_->width; }
  int height() const override { return frame_->height; }

  image::RgbRegion rgb(int x0, int y0, int x1, int y1, int scale_num) override {
    const auto format = static_cast<AVPixelFormat>(frame_->format);
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    if (desc == nullptr) throw DecodeError(*path_ + ": a frame of an unknown pixel format");
    const bool croppable = (desc->flags & (AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_BITSTREAM |
                                           AV_PIX_FMT_FLAG_HWACCEL)) == 0 &&
                           (desc->flags & AV_PIX_FMT_FLAG_PLANAR) != 0;
    // The region in the scaled picture's coordinates, and the frame's pixels it covers (each
    // scaled pixel is f x f of them); its origin on whole chroma samples.
    const int f = 8 / scale_num;
    if (!croppable) {
      x0 = y0 = 0;
      x1 = image::internal::scaled_size(frame_->width, scale_num);
      y1 = image::internal::scaled_size(frame_->height, scale_num);
    }
    while (((x0 * f) & ((1 << desc->log2_chroma_w) - 1)) != 0) --x0;
    while (((y0 * f) & ((1 << desc->log2_chroma_h) - 1)) != 0) --y0;
    const int sx0 = x0 * f, sy0 = y0 * f;
    const int sw = std::min(frame_->width, x1 * f) - sx0;
    const int sh = std::min(frame_->height, y1 * f) - sy0;
    const uint8_t* src[4] = {};
    int src_stride[4] = {};
    for (int p = 0; p < 4 && frame_->data[p] != nullptr; ++p) {
      int step = 0;
      for (int c = 0; c < desc->nb_components; ++c)
        if (desc->comp[c].plane == p) step = std::max(step, desc->comp[c].step);
      const bool chroma = p == 1 || p == 2;
      const int px = chroma ? sx0 >> desc->log2_chroma_w : sx0;
      const int py = chroma ? sy0 >> desc->log2_chroma_h : sy0;
      src[p] = frame_->data[p] + static_cast<ptrdiff_t>(py) * frame_->linesize[p] +
               static_cast<ptrdiff_t>(px) * step;
      src_stride[p] = frame_->linesize[p];
    }
    // A conversion only, as PyAV's (libswscale's unscaled converters are SIMD; its area scaler
    // takes 1.9x as long as this and the halving together on a 640x480 frame: tools/
    // convert_bench.cc). Scaled: halved once per factor of 2, each pixel the rounded mean of the
    // 2x2 below it.
    sws_.reset(sws_getCachedContext(sws_.release(), sw, sh, format, sw, sh, AV_PIX_FMT_RGB24,
                                    SWS_BILINEAR, nullptr, nullptr, nullptr));
    if (!sws_) throw DecodeError(*path_ + ": cannot convert " + desc->name + " frames to RGB");
    set_colorspace(format);
    RgbBuffer* into = f == 1 ? &out_ : &full_;
    uint8_t* dst[4] = {into->reserve(sw, sh), nullptr, nullptr, nullptr};
    int dst_stride[4] = {static_cast<int>(into->stride), 0, 0, 0};
    if (sws_scale(sws_.get(), src, src_stride, 0, sh, dst, dst_stride) != sh)
      throw DecodeError(*path_ + ": libswscale could not convert a frame to RGB");
    // (ceil(ceil(n / 2) / 2) is ceil(n / 4): the last halving leaves w x h.)
    for (int k = f, cw = sw, ch = sh; k > 1; k /= 2, cw = (cw + 1) / 2, ch = (ch + 1) / 2) {
      RgbBuffer* next = k == 2 ? &out_ : into == &full_ ? &half_ : &full_;
      uint8_t* half = next->reserve((cw + 1) / 2, (ch + 1) / 2);
      image::internal::halve_rgb8(into->data.get(), into->stride, cw, ch, half, next->stride);
      into = next;
    }
    return {x0, y0, x1, y1, out_.data.get(), out_.stride};
  }

 private:
  // An enum field as the stream states it: decoders copy the bitstream's value, which may be none
  // of the enum's (reading it as the enum would be undefined behaviour).
  template <typename Enum>
  static int stated(const Enum& field) {
    std::underlying_type_t<Enum> value;
    std::memcpy(&value, &field, sizeof value);
    return static_cast<int>(value);
  }

  // The frame's matrix coefficients and range, where it states them (BT.601, limited range,
  // otherwise: libswscale's default, and PyAV's).
  void set_colorspace(AVPixelFormat format) {
    int space = SWS_CS_DEFAULT;
    switch (stated(frame_->colorspace)) {
      case AVCOL_SPC_BT709:
        space = SWS_CS_ITU709;
        break;
      case AVCOL_SPC_FCC:
        space = SWS_CS_FCC;
        break;
      case AVCOL_SPC_SMPTE240M:
        space = SWS_CS_SMPTE240M;
        break;
      case AVCOL_SPC_BT2020_NCL:
      case AVCOL_SPC_BT2020_CL:
        space = SWS_CS_BT2020;
        break;
      default:
        break;
    }
    const bool full = stated(frame_->color_range) == AVCOL_RANGE_JPEG || format == AV_PIX_FMT_YUVJ420P ||
                      format == AV_PIX_FMT_YUVJ422P || format == AV_PIX_FMT_YUVJ444P;
    int* inv_table = nullptr;
    int* table = nullptr;
    int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
    if (sws_getColorspaceDetails(sws_.get(), &inv_table, &src_range, &table, &dst_range,
                                 &brightness, &contrast, &saturation) < 0)
      return;  // an RGB source: nothing to set
    sws_setColorspaceDetails(sws_.get(), sws_getCoefficients(space), full ? 1 : 0,
                             sws_getCoefficients(SWS_CS_DEFAULT), 1, brightness, contrast,
                             saturation);
  }

  const AVFrame* frame_ = nullptr;
  const std::string* path_ = nullptr;
  // Packed RGB rows 64-byte aligned, grown as needed: the frame's rectangle at full size and
  // once halved (when scaled), and what rgb() returns.
  struct RgbBuffer {
    std::unique_ptr<uint8_t, AvFree> data;
    size_t capacity = 0, stride = 0;

    uint8_t* reserve(int w, int h) {
      stride = (static_cast<size_t>(w) * 3 + 63) & ~size_t{63};
      const size_t need = stride * static_cast<size_t>(h) + 64;
      if (need > capacity) {
        data.reset(static_cast<uint8_t*>(av_malloc(need)));
        if (!data) throw std::bad_alloc();
        capacity = need;
      }
      return data.get();
    }
  };

  std::unique_ptr<SwsContext, SwsFree> sws_;
  RgbBuffer full_, half_, out_;
};

}  // namespace

size_t VideoIndex::keyframe_for(uint64_t frame) const {
  const int64_t t = pts[frame];
  // Keyframes come in decode order with rising pts: the last at or before t.
  auto it = std::upper_bound(keyframes.begin(), keyframes.end(), t,
                             [](int64_t v, const Keyframe& k) { return v < k.pts; });
  return it == keyframes.begin() ? 0 : static_cast<size_t>(it - keyframes.begin()) - 1;
}

struct VideoReader::Impl {
  int threads;
  std::string path;
  // A video in memory: its bytes and FFmpeg's I/O context over them (freed after `format`).
  std::unique_ptr<MemoryInput> memory;
  std::unique_ptr<AVIOContext, IoCloser> io;
  std::unique_ptr<AVFormatContext, FormatCloser> format;
  std::unique_ptr<AVCodecContext, CodecCloser> codec;
  std::unique_ptr<AVFrame, FrameFree> frame{av_frame_alloc()};
  std::unique_ptr<AVPacket, PacketFree> packet{av_packet_alloc()};
  FramePicture picture;
  int stream = -1;
  ReaderStats stats;
  // Where decoding stands, so that a later clip of the same video can go on forward: the
  // keyframe decoding started from, the largest pts sent (frames up to it may have been skipped)
  // and the last output. Invalid after a seek to the index's start, an error or the end.
  bool positioned = false;
  size_t current_keyframe = 0;
  int64_t max_sent_pts = AV_NOPTS_VALUE;
  int64_t last_output = AV_NOPTS_VALUE;
  bool at_eof = false;
  bool pending = false;  // `packet` holds the next packet to send (a seek's keyframe)

  void close() {
    if (pending) av_packet_unref(packet.get());
    pending = false;
    codec.reset();
    format.reset();
    io.reset();
    memory.reset();
    path.clear();
    stream = -1;
    positioned = false;
  }

  // Whether the open decoder decodes a stream of parameters `par` as it is: the same codec,
  // size, pixel format and extradata (the parameter sets of H.264/HEVC, AV1's sequence
  // header). Videos encoded alike (a dataset's, mostly) then share one decoder, flushed between
  // them, instead of opening one per video.
  static bool reusable(const AVCodecContext* c, const AVCodec* decoder,
                       const AVCodecParameters* par) {
    return c != nullptr && c->codec == decoder && c->width == par->width &&
           c->height == par->height &&
           (par->format == AV_PIX_FMT_NONE || c->pix_fmt == par->format) &&
           c->extradata_size == par->extradata_size &&
           (par->extradata_size == 0 ||
            std::memcmp(c->extradata, par->extradata, par->extradata_size) == 0);
  }

  void open(const std::string& p, std::vector<std::byte>* bytes = nullptr) {
    std::unique_ptr<AVCodecContext, CodecCloser> previous = std::move(codec);
    close();
    AVFormatContext* f = avformat_alloc_context();
    if (f == nullptr) throw std::bad_alloc();
    // Packets without a pts (AVI) get one, so that every frame is known by its timestamp.
    f->flags |= AVFMT_FLAG_GENPTS;
    if (bytes != nullptr) {
      memory = std::make_unique<MemoryInput>();
      memory->bytes = std::move(*bytes);
      constexpr int kBuffer = 1 << 16;
      auto* buffer = static_cast<unsigned char*>(av_malloc(kBuffer));
      if (buffer == nullptr) {
        avformat_free_context(f);
        throw std::bad_alloc();
      }
      io.reset(avio_alloc_context(buffer, kBuffer, 0, memory.get(), &MemoryInput::read, nullptr,
                                  &MemoryInput::seek));
      if (!io) {
        av_free(buffer);
        avformat_free_context(f);
        throw std::bad_alloc();
      }
      f->pb = io.get();
      f->flags |= AVFMT_FLAG_CUSTOM_IO;
    }
    // On failure avformat_open_input frees the context (not a custom I/O context).
    const int rc = avformat_open_input(&f, bytes != nullptr ? "" : p.c_str(), nullptr, nullptr);
    if (rc < 0) {
      if (rc == AVERROR(ENOENT) || rc == AVERROR(EACCES) || rc == AVERROR(EISDIR))
        throw IoError(p + ": cannot open: " + av_error(rc));
      throw DecodeError(p + ": not a video FFmpeg can read: " + av_error(rc));
    }
    format.reset(f);
    const AVCodec* decoder = nullptr;
    int s = av_find_best_stream(f, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
    if (s == AVERROR_STREAM_NOT_FOUND || (s >= 0 && f->streams[s]->codecpar->width == 0)) {
      // Containers whose header does not say it all (MPEG-TS, some AVI): probe some packets.
      if (avformat_find_stream_info(f, nullptr) < 0)
        throw DecodeError(p + ": cannot read the streams' parameters");
      s = av_find_best_stream(f, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
    }
    if (s == AVERROR_STREAM_NOT_FOUND) throw DecodeError(p + ": has no video stream");
    if (s < 0 || decoder == nullptr) {
      const AVCodecParameters* par = s >= 0 ? f->streams[s]->codecpar : nullptr;
      throw DecodeError(p + ": no decoder for its video codec" +
                        (par ? std::string(" (") + avcodec_get_name(par->codec_id) + ")" : ""));
    }
    for (unsigned i = 0; i < f->nb_streams; ++i)
      f->streams[i]->discard = static_cast<int>(i) == s ? AVDISCARD_DEFAULT : AVDISCARD_ALL;
    if (reusable(previous.get(), decoder, f->streams[s]->codecpar)) {
      codec = std::move(previous);
      avcodec_flush_buffers(codec.get());
      codec->pkt_timebase = f->streams[s]->time_base;
      ++stats.decoder_reuses;
    } else {
      previous.reset();
      AVCodecContext* c = avcodec_alloc_context3(decoder);
      codec.reset(c);
      if (c == nullptr || avcodec_parameters_to_context(c, f->streams[s]->codecpar) < 0)
        throw DecodeError(p + ": cannot set up its decoder");
      c->thread_count = threads;
      c->max_pixels = image::kDefaultMaxPixels;  // PIL's limit, as for images: no giant frames
      c->pkt_timebase = f->streams[s]->time_base;
      const int orc = avcodec_open2(c, decoder, nullptr);
      if (orc < 0)
        throw DecodeError(p + ": cannot open its " + decoder->name + " decoder: " + av_error(orc));
    }
    stream = s;
    path = p;
    ++stats.opens;
  }

  VideoIndex build_index() {
    VideoIndex index;
    AVStream* st = format->streams[stream];
    index.stream = stream;
    index.width = st->codecpar->width;
    index.height = st->codecpar->height;
    index.time_base_num = st->time_base.num;
    index.time_base_den = st->time_base.den;
    index.codec = codec->codec->name;
    seek_start();
    AVPacket* pkt = packet.get();
    while (true) {
      const int rc = av_read_frame(format.get(), pkt);
      if (rc == AVERROR_EOF) break;
      if (rc < 0) throw DecodeError(path + ": cannot read its packets: " + av_error(rc));
      if (pkt->stream_index == stream) {
        const int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
        if (ts == AV_NOPTS_VALUE) {
          av_packet_unref(pkt);
          throw DecodeError(path + ": a video packet without a timestamp (packet " +
                            std::to_string(index.pts.size()) + ")");
        }
        if ((pkt->flags & AV_PKT_FLAG_KEY) != 0)
          index.keyframes.push_back({ts, pkt->dts != AV_NOPTS_VALUE ? pkt->dts : ts});
        if ((pkt->flags & AV_PKT_FLAG_DISCARD) == 0 && pkt->size > 0) index.pts.push_back(ts);
      }
      av_packet_unref(pkt);
    }
    std::sort(index.pts.begin(), index.pts.end());
    index.pts.erase(std::unique(index.pts.begin(), index.pts.end()), index.pts.end());
    positioned = false;
    return index;
  }

  void seek_start() {
    avcodec_flush_buffers(codec.get());
    // The first keyframe: the last at or before the stream's start (whose dts may be negative).
    const AVStream* st = format->streams[stream];
    const int64_t start =
        st->start_time != AV_NOPTS_VALUE ? std::min<int64_t>(st->start_time, 0) : 0;
    int rc = av_seek_frame(format.get(), stream, start, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) rc = av_seek_frame(format.get(), -1, 0, AVSEEK_FLAG_BYTE);
    if (rc < 0) throw DecodeError(path + ": cannot seek to its start: " + av_error(rc));
    positioned = false;
    at_eof = false;
    if (pending) av_packet_unref(packet.get());
    pending = false;
  }

  // Seeks to keyframe `keyframe` of the index: the demuxer's seek lands at or before it (mov
  // seeks by its own sample times, which an edit list shifts), so the packets before it are read
  // and dropped (no decoding); one that lands past it starts again from the stream's start. The
  // keyframe's packet is left in `packet`, pending, for decode() to send first.
  void seek_to(const VideoIndex& index, size_t keyframe) {
    avcodec_flush_buffers(codec.get());
    ++stats.seeks;
    at_eof = false;
    if (pending) av_packet_unref(packet.get());
    pending = false;
    positioned = true;
    current_keyframe = keyframe;
    max_sent_pts = AV_NOPTS_VALUE;
    last_output = AV_NOPTS_VALUE;
    if (index.keyframes.empty()) {
      seek_start();
      positioned = true;
      return;
    }
    const VideoIndex::Keyframe target = index.keyframes[keyframe];
    bool from_start = keyframe == 0;
    if (from_start || av_seek_frame(format.get(), stream, target.dts, AVSEEK_FLAG_BACKWARD) < 0) {
      seek_start();
      from_start = true;
    }
    positioned = true;
    AVPacket* pkt = packet.get();
    while (true) {
      const int rc = av_read_frame(format.get(), pkt);
      if (rc < 0) {
        throw DecodeError(path + ": its keyframe" + at_time(&index, target.pts) +
                          " is not where its index says (" + av_error(rc) + ")");
      }
      if (pkt->stream_index != stream) {
        av_packet_unref(pkt);
        continue;
      }
      const int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
      if ((pkt->flags & AV_PKT_FLAG_KEY) != 0 && ts == target.pts) {
        pending = true;
        return;
      }
      const bool past = pkt->dts != AV_NOPTS_VALUE && pkt->dts > target.dts;
      av_packet_unref(pkt);
      if (past) {
        if (from_start) {
          throw DecodeError(path + ": its keyframe" + at_time(&index, target.pts) +
                            " is not where its index says");
        }
        seek_start();
        positioned = true;
        from_start = true;
      }
    }
  }

  void read_frames(const VideoIndex& index, std::span<const uint64_t> wanted,
                   const FrameSink& sink) {
    if (wanted.empty()) return;
    const int64_t first_pts = index.pts[wanted.front()];
    const int64_t last_pts = index.pts[wanted.back()];
    const size_t keyframe = index.keyframe_for(wanted.front());
    // Go on forward from where the last call stopped when that is past the keyframe a seek
    // would land on and no frame wanted now was skipped or output already.
    const bool forward = positioned && !at_eof && current_keyframe >= keyframe &&
                         (max_sent_pts == AV_NOPTS_VALUE || max_sent_pts < first_pts) &&
                         (last_output == AV_NOPTS_VALUE || last_output < first_pts);
    if (!forward) seek_to(index, keyframe);
    try {
      decode(index, wanted, sink, last_pts);
    } catch (...) {
      positioned = false;
      throw;
    }
  }

  // Whether pts is one of the wanted frames' (ascending, from position `from` on).
  static bool wanted_pts(const VideoIndex& index, std::span<const uint64_t> wanted, size_t from,
                         int64_t pts) {
    for (size_t k = from; k < wanted.size(); ++k) {
      const int64_t w = index.pts[wanted[k]];
      if (w == pts) return true;
      if (w > pts) return false;
    }
    return false;
  }

  void decode(const VideoIndex& index, std::span<const uint64_t> wanted, const FrameSink& sink,
              int64_t last_pts, bool skip = true) {
    AVCodecContext* c = codec.get();
    AVPacket* pkt = packet.get();
    AVFrame* fr = frame.get();
    size_t next = 0;
    bool draining = false;
    while (next < wanted.size()) {
      int rc = avcodec_receive_frame(c, fr);
      if (rc == 0) {
        ++stats.frames_decoded;
        const int64_t pts = fr->pts != AV_NOPTS_VALUE ? fr->pts : fr->best_effort_timestamp;
        last_output = pts;
        while (next < wanted.size() && index.pts[wanted[next]] < pts) {
          const int64_t missing = index.pts[wanted[next]];
          av_frame_unref(fr);
          throw DecodeError(path + ": the frame" + at_time(&index, missing) +
                            " was never decoded (the next came" + at_time(&index, pts) +
                            "): its packets disagree with the index, or are damaged");
        }
        if (next < wanted.size() && index.pts[wanted[next]] == pts) {
          picture.reset(fr, &path);
          while (next < wanted.size() && index.pts[wanted[next]] == pts) {
            if (sink) sink(next, picture, pts);
            ++next;
          }
        }
        av_frame_unref(fr);
        continue;
      }
      if (rc == AVERROR_EOF) {
        at_eof = true;
        throw DecodeError(path + ": the stream ended before the frame" +
                          at_time(&index, index.pts[wanted[next]]) + " (the last decoded was" +
                          at_time(&index, last_output) +
                          "): it is truncated, or disagrees with its index");
      }
      if (rc != AVERROR(EAGAIN))
        throw DecodeError(path + ": cannot decode" + at_time(&index, last_output) + ": " +
                          av_error(rc));
      if (draining) {  // EAGAIN while draining should not happen
        throw DecodeError(path + ": the decoder stalled" + at_time(&index, last_output));
      }
      // The decoder wants input: the next packet of the stream.
      rc = pending ? 0 : av_read_frame(format.get(), pkt);
      pending = false;
      if (rc == AVERROR_EOF) {
        draining = at_eof = true;  // a drained decoder goes on only after a seek
        rc = avcodec_send_packet(c, nullptr);
        if (rc < 0 && rc != AVERROR_EOF)
          throw DecodeError(path + ": cannot drain the decoder: " + av_error(rc));
        continue;
      }
      if (rc < 0)
        throw DecodeError(path + ": cannot read a packet" + at_time(&index, last_output) + ": " +
                          av_error(rc));
      if (pkt->stream_index != stream) {
        av_packet_unref(pkt);
        continue;
      }
      const int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
      if ((pkt->flags & AV_PKT_FLAG_KEY) != 0 && ts != AV_NOPTS_VALUE) {
        auto it =
            std::upper_bound(index.keyframes.begin(), index.keyframes.end(), ts,
                             [](int64_t v, const VideoIndex::Keyframe& k) { return v < k.pts; });
        if (it != index.keyframes.begin())
          current_keyframe =
              std::max(current_keyframe, static_cast<size_t>(it - index.keyframes.begin()) - 1);
      }
      if (ts != AV_NOPTS_VALUE)
        max_sent_pts = max_sent_pts == AV_NOPTS_VALUE ? ts : std::max(max_sent_pts, ts);
      // A frame no one wants is skipped where it is not a reference.
      const bool want =
          !skip || ts == AV_NOPTS_VALUE || (ts <= last_pts && wanted_pts(index, wanted, next, ts));
      c->skip_frame = want ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
      rc = avcodec_send_packet(c, pkt);
      av_packet_unref(pkt);
      if (rc < 0 && rc != AVERROR(EAGAIN) && rc != AVERROR_INVALIDDATA)
        throw DecodeError(path + ": cannot decode the packet" + at_time(&index, ts) + ": " +
                          av_error(rc));
      if (rc == AVERROR_INVALIDDATA)
        throw DecodeError(path + ": corrupt data in the packet" + at_time(&index, ts));
    }
  }
};

namespace {

// FFmpeg's own log (this process's copy of libavutil, which no other module shares): quiet but
// for fatal errors, since every failure reaches the user as an exception naming the file;
// $STOKER_FFMPEG_LOGLEVEL (quiet, panic, fatal, error, warning, info, verbose, debug, trace)
// sets another level.
void set_log_level() {
  static std::once_flag once;
  std::call_once(once, [] {
    int level = AV_LOG_FATAL;
    if (const char* env = std::getenv("STOKER_FFMPEG_LOGLEVEL")) {
      const std::pair<const char*, int> levels[] = {
          {"quiet", AV_LOG_QUIET},     {"panic", AV_LOG_PANIC},     {"fatal", AV_LOG_FATAL},
          {"error", AV_LOG_ERROR},     {"warning", AV_LOG_WARNING}, {"info", AV_LOG_INFO},
          {"verbose", AV_LOG_VERBOSE}, {"debug", AV_LOG_DEBUG},     {"trace", AV_LOG_TRACE}};
      for (const auto& [name, value] : levels)
        if (std::strcmp(env, name) == 0) level = value;
    }
    av_log_set_level(level);
  });
}

}  // namespace

VideoReader::VideoReader(int decoder_threads) : impl_(std::make_unique<Impl>()) {
  set_log_level();
  impl_->threads = decoder_threads;
  if (!impl_->frame || !impl_->packet) throw std::bad_alloc();
}
VideoReader::~VideoReader() = default;

void VideoReader::open(const std::string& path) {
  if (is_open(path)) return;
  try {
    impl_->open(path);
  } catch (...) {
    impl_->close();
    throw;
  }
}

void VideoReader::open_bytes(const std::string& name, std::vector<std::byte> bytes) {
  if (is_open(name)) return;
  try {
    impl_->open(name, &bytes);
  } catch (...) {
    impl_->close();
    throw;
  }
}

bool VideoReader::is_open(const std::string& name) const {
  return impl_->format && impl_->path == name;
}

const std::string& VideoReader::path() const { return impl_->path; }

VideoIndex VideoReader::build_index() {
  try {
    return impl_->build_index();
  } catch (...) {
    impl_->close();
    throw;
  }
}

void VideoReader::read_frames(const VideoIndex& index, std::span<const uint64_t> wanted,
                              const FrameSink& sink) {
  impl_->read_frames(index, wanted, sink);
}

uint64_t VideoReader::decode_span(const VideoIndex& index, uint64_t first, uint64_t last) {
  const uint64_t before = impl_->stats.frames_decoded;
  impl_->seek_to(index, index.keyframe_for(first));
  const uint64_t wanted[] = {last};
  try {
    impl_->decode(index, wanted, nullptr, index.pts[last], false);
  } catch (...) {
    impl_->positioned = false;
    throw;
  }
  impl_->positioned = false;
  return impl_->stats.frames_decoded - before;
}

const ReaderStats& VideoReader::stats() const { return impl_->stats; }

namespace {

constexpr char kMagic[8] = {'S', 'T', 'K', 'V', 'I', 'D', 'X', '\0'};
constexpr uint32_t kVersion = 1;

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// Reads from a byte span, failing (ok = false) past its end.
struct Cursor {
  std::span<const std::byte> bytes;
  size_t pos = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (bytes.size() - pos < sizeof(T)) {
      ok = false;
      return v;
    }
    std::memcpy(&v, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  // A count of items of `item` bytes that fit in what is left.
  uint64_t count(size_t item) {
    const auto n = get<uint64_t>();
    if (!ok || n > (bytes.size() - pos) / item) ok = false;
    return ok ? n : 0;
  }
};

}  // namespace

std::string serialize_index(const VideoIndex& index, uint64_t video_size) {
  std::string out(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, video_size);
  put<int32_t>(out, index.stream);
  put<int32_t>(out, index.width);
  put<int32_t>(out, index.height);
  put(out, index.time_base_num);
  put(out, index.time_base_den);
  put<uint64_t>(out, index.codec.size());
  out += index.codec;
  put<uint64_t>(out, index.pts.size());
  for (int64_t t : index.pts) put(out, t);
  put<uint64_t>(out, index.keyframes.size());
  for (const auto& k : index.keyframes) {
    put(out, k.pts);
    put(out, k.dts);
  }
  return out;
}

std::optional<VideoIndex> parse_index(std::span<const std::byte> bytes, uint64_t video_size) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return std::nullopt;
  Cursor c{bytes, sizeof kMagic};
  if (c.get<uint32_t>() != kVersion || c.get<uint64_t>() != video_size) return std::nullopt;
  VideoIndex index;
  index.stream = c.get<int32_t>();
  index.width = c.get<int32_t>();
  index.height = c.get<int32_t>();
  index.time_base_num = c.get<int64_t>();
  index.time_base_den = c.get<int64_t>();
  const uint64_t codec = c.count(1);
  if (c.ok) {
    index.codec.assign(reinterpret_cast<const char*>(bytes.data() + c.pos), codec);
    c.pos += codec;
  }
  index.pts.resize(c.count(sizeof(int64_t)));
  for (int64_t& t : index.pts) t = c.get<int64_t>();
  index.keyframes.resize(c.count(2 * sizeof(int64_t)));
  for (auto& k : index.keyframes) {
    k.pts = c.get<int64_t>();
    k.dts = c.get<int64_t>();
  }
  if (!c.ok || c.pos != bytes.size() || index.time_base_num <= 0 || index.time_base_den <= 0 ||
      index.stream < 0 || !std::is_sorted(index.pts.begin(), index.pts.end()))
    return std::nullopt;
  return index;
}

std::string ffmpeg_versions() {
  auto v = [](const char* name, unsigned version) {
    return std::string(name) + " " + std::to_string(AV_VERSION_MAJOR(version)) + "." +
           std::to_string(AV_VERSION_MINOR(version)) + "." +
           std::to_string(AV_VERSION_MICRO(version));
  };
  return v("libavformat", avformat_version()) + ", " + v("libavcodec", avcodec_version()) + ", " +
         v("libswscale", swscale_version()) + ", " + v("libavutil", avutil_version());
}

}  // namespace stoker::video
