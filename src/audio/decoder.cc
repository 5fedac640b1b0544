#include "stoker/audio/decoder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <span>

#include "audio/flac_frames.h"
#include "stoker/errors.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}

namespace stoker::audio {
namespace {

// Decoded before a cut's offset after a seek, for the codecs whose first frames after a jump
// need the ones before (MP3's bit reservoir, Opus's 80 ms pre-roll); trimmed away by timestamp.
constexpr double kPreroll = 0.1;

// Whether a codec's frames after a seek need the ones before: all but those whose frames decode
// alone (a FLAC block, PCM), for which the seek lands on the frame the cut starts in.
bool needs_preroll(AVCodecID id) {
  const bool pcm = id >= AV_CODEC_ID_FIRST_AUDIO && id < AV_CODEC_ID_ADPCM_IMA_QT;
  return !(pcm || id == AV_CODEC_ID_FLAC);
}

struct FormatCloser {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct CodecFreer {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFreer {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFreer {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwrFreer {
  void operator()(SwrContext* s) const { swr_free(&s); }
};
using Format = std::unique_ptr<AVFormatContext, FormatCloser>;
using Codec = std::unique_ptr<AVCodecContext, CodecFreer>;
using Frame = std::unique_ptr<AVFrame, FrameFreer>;
using Packet = std::unique_ptr<AVPacket, PacketFreer>;
using Swr = std::unique_ptr<SwrContext, SwrFreer>;

std::string av_message(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, buf, sizeof buf);
  return buf;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

using Clock = std::chrono::steady_clock;

// FFmpeg's own log quiet but for fatal messages: the errors reach the caller as exceptions.
// $STOKER_FFMPEG_LOGLEVEL sets another level, as for the video wing (src/ffmpeg/reader.cc, whose
// library the audio wing does not link: it needs libswscale).
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

// Encoded audio in memory, read by FFmpeg through an AVIOContext: read and seek over the bytes
// (AVSEEK_SIZE says their size, as a file's would), so that the demuxers probe, seek and estimate
// durations as they do on a file. Owns the AVIOContext and its buffer (FFmpeg may reallocate it);
// the AVFormatContext that reads it must be closed first (Opened's member order).
struct MemoryInput {
  const uint8_t* data = nullptr;
  int64_t size = 0;
  int64_t pos = 0;
  AVIOContext* avio = nullptr;

  MemoryInput() = default;
  MemoryInput(const MemoryInput&) = delete;
  MemoryInput& operator=(const MemoryInput&) = delete;
  ~MemoryInput() {
    if (avio != nullptr) {
      av_freep(&avio->buffer);
      avio_context_free(&avio);
    }
  }

  static int read(void* opaque, uint8_t* buf, int n) {
    auto* m = static_cast<MemoryInput*>(opaque);
    const int64_t left = m->size - m->pos;
    if (left <= 0) return AVERROR_EOF;
    const int k = static_cast<int>(std::min<int64_t>(n, left));
    std::memcpy(buf, m->data + m->pos, static_cast<size_t>(k));
    m->pos += k;
    return k;
  }

  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* m = static_cast<MemoryInput*>(opaque);
    if (whence & AVSEEK_SIZE) return m->size;
    int64_t to = 0;
    switch (whence & ~AVSEEK_FORCE) {
      case SEEK_SET:
        to = offset;
        break;
      case SEEK_CUR:
        to = m->pos + offset;
        break;
      case SEEK_END:
        to = m->size + offset;
        break;
      default:
        return AVERROR(EINVAL);
    }
    // Past the end is allowed, as lseek allows it on a file (reads there are at end of file):
    // the demuxers that skip a chunk a header says is longer than the file (WAV's data chunk)
    // must take the same path as on a file.
    if (to < 0) return AVERROR(EINVAL);
    m->pos = to;
    return to;
  }
};

// The AVIOContext's buffer: what FFmpeg copies the bytes through (its own default size).
constexpr int kIoBuffer = 32 * 1024;

// An opened input and its audio stream.
struct Opened {
  std::unique_ptr<MemoryInput> memory;  // bytes in memory; declared first: closed after `format`
  Format format;
  int stream = -1;
  AVStream* st = nullptr;
  const AVCodec* decoder = nullptr;
};

// A FLAC stream's rate and channels from its STREAMINFO (the stream's extradata, as FLAC's own
// demuxer gives it), which that demuxer leaves to avformat_find_stream_info to find by parsing
// and decoding the first frames: read here, that probing (a twentieth of a short slice's time) is
// not needed. The decoder reads the same STREAMINFO itself when it opens.
void flac_stream_info(AVCodecParameters* p) {
  if (p->codec_id != AV_CODEC_ID_FLAC || p->extradata_size != 34 || p->sample_rate > 0) return;
  const uint8_t* b = p->extradata;
  const int rate = (b[10] << 12) | (b[11] << 4) | (b[12] >> 4);
  const int channels = ((b[12] >> 1) & 7) + 1;
  if (rate <= 0 || rate > 655350) return;  // not a valid STREAMINFO: probed as before
  p->sample_rate = rate;
  av_channel_layout_uninit(&p->ch_layout);
  av_channel_layout_default(&p->ch_layout, channels);
}

// The audio stream of an opened input: its codec's parameters from the header, else probed (a
// few packets read, never the whole input), and a decoder for it.
void find_audio(Opened& o, const std::string& name) {
  AVFormatContext* raw = o.format.get();
  for (unsigned i = 0; i < raw->nb_streams; ++i) flac_stream_info(raw->streams[i]->codecpar);
  const bool known = [&] {
    for (unsigned i = 0; i < raw->nb_streams; ++i) {
      const AVCodecParameters* p = raw->streams[i]->codecpar;
      if (p->codec_type == AVMEDIA_TYPE_AUDIO && p->sample_rate > 0 && p->ch_layout.nb_channels > 0)
        return true;
    }
    return false;
  }();
  if (!known) {
    if (int err = avformat_find_stream_info(raw, nullptr); err < 0)
      throw DecodeError(name + ": cannot read its streams (" + av_message(err) + ")");
  }
  o.stream = av_find_best_stream(raw, AVMEDIA_TYPE_AUDIO, -1, -1, &o.decoder, 0);
  if (o.stream == AVERROR_STREAM_NOT_FOUND) throw DecodeError(name + ": has no audio stream");
  if (o.stream < 0 || o.decoder == nullptr) {  // named by FFmpeg's codec, else the file's tag
    std::string what = "unknown";
    for (unsigned i = 0; i < raw->nb_streams; ++i) {
      const AVCodecParameters* p = raw->streams[i]->codecpar;
      if (p->codec_type != AVMEDIA_TYPE_AUDIO) continue;
      char tag[32];
      std::snprintf(tag, sizeof tag, "codec tag 0x%04x", p->codec_tag);
      const AVCodecDescriptor* d = avcodec_descriptor_get(p->codec_id);
      what = d != nullptr && p->codec_id != AV_CODEC_ID_NONE ? std::string(d->name) : tag;
      break;
    }
    throw DecodeError(name + ": an audio codec this FFmpeg cannot decode (" + what + ")");
  }
  o.st = raw->streams[o.stream];
}

// The demuxer for input that begins with `head`, where its first bytes say it beyond doubt, so
// that opening it skips probing every demuxer (a tenth of a short slice's time, and most of a
// short WAV's): a FLAC stream's "fLaC" marker, a WAV's "RIFF" + "WAVE", an Ogg page's "OggS",
// which is what probing finds there too (FLAC with ID3 tags before it is probed). Else null:
// probed as before.
const AVInputFormat* known_format(const unsigned char* head, size_t n) {
  if (n >= 4 && std::memcmp(head, "fLaC", 4) == 0) return av_find_input_format("flac");
  if (n >= 12 && std::memcmp(head, "RIFF", 4) == 0 && std::memcmp(head + 8, "WAVE", 4) == 0)
    return av_find_input_format("wav");
  if (n >= 4 && std::memcmp(head, "OggS", 4) == 0) return av_find_input_format("ogg");
  return nullptr;
}

// A file's size and its first bytes (up to `n`) into `head`; IoError where it cannot be read.
uint64_t file_head(const std::string& path, unsigned char* head, size_t n, size_t* got) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw IoError(path + ": cannot open (" + std::strerror(err) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(path + ": cannot open (" +
                  (S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file") + ")");
  }
  const ssize_t k = st.st_size > 0 ? ::pread(fd, head, n, 0) : 0;
  ::close(fd);
  *got = k > 0 ? static_cast<size_t>(k) : 0;
  return static_cast<uint64_t>(st.st_size);
}

Opened open_file(const std::string& path) {
  set_log_level();
  unsigned char head[12];
  size_t got = 0;
  if (file_head(path, head, sizeof head, &got) == 0)
    throw DecodeError(path + ": is empty (0 bytes)");
  Opened o;
  AVFormatContext* raw = nullptr;
  // Through the file protocol by name: a path with a colon ("take:2.wav") is not a protocol.
  const std::string url = "file:" + path;
  if (int err = avformat_open_input(&raw, url.c_str(), known_format(head, got), nullptr); err < 0) {
    if (err == AVERROR(ENOENT) || err == AVERROR(EACCES))
      throw IoError(path + ": cannot open (" + av_message(err) + ")");
    throw DecodeError(path + ": not an audio file FFmpeg can read (" + av_message(err) + ")");
  }
  o.format.reset(raw);
  find_audio(o, path);
  return o;
}

// Bytes in memory, probed by their content (and the name's extension, as FFmpeg weighs a file's).
Opened open_memory(std::span<const std::byte> bytes, const std::string& name) {
  set_log_level();
  if (bytes.empty()) throw DecodeError(name + ": is empty (0 bytes)");
  Opened o;
  o.memory = std::make_unique<MemoryInput>();
  o.memory->data = reinterpret_cast<const uint8_t*>(bytes.data());
  o.memory->size = static_cast<int64_t>(bytes.size());
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBuffer));
  if (buffer == nullptr) throw std::bad_alloc();
  o.memory->avio = avio_alloc_context(buffer, kIoBuffer, 0, o.memory.get(), &MemoryInput::read,
                                      nullptr, &MemoryInput::seek);
  if (o.memory->avio == nullptr) {
    av_free(buffer);
    throw std::bad_alloc();
  }
  AVFormatContext* raw = avformat_alloc_context();
  if (raw == nullptr) throw std::bad_alloc();
  raw->pb = o.memory->avio;
  raw->flags |= AVFMT_FLAG_CUSTOM_IO;
  // (On failure avformat_open_input frees `raw`, not the AVIOContext: MemoryInput does.)
  const auto* head = reinterpret_cast<const unsigned char*>(bytes.data());
  if (int err = avformat_open_input(&raw, name.c_str(), known_format(head, bytes.size()), nullptr);
      err < 0)
    throw DecodeError(name + ": not audio FFmpeg can read (" + av_message(err) + ")");
  o.format.reset(raw);
  find_audio(o, name);
  return o;
}

// The stream's duration less its start (the samples a decoder skips: an MP3's encoder delay,
// Opus's pre-skip), else the container's less its start.
double stream_duration(const Opened& o) {
  const AVStream* st = o.st;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    const int64_t start =
        st->start_time != AV_NOPTS_VALUE ? std::max<int64_t>(st->start_time, 0) : 0;
    return static_cast<double>(std::max<int64_t>(st->duration - start, 0)) * av_q2d(st->time_base);
  }
  const AVFormatContext* f = o.format.get();
  if (f->duration != AV_NOPTS_VALUE && f->duration > 0) {
    const int64_t start = f->start_time != AV_NOPTS_VALUE ? std::max<int64_t>(f->start_time, 0) : 0;
    return static_cast<double>(std::max<int64_t>(f->duration - start, 0)) / AV_TIME_BASE;
  }
  return 0;
}

double stream_start(const AVStream* st) {
  return st->start_time != AV_NOPTS_VALUE ? st->start_time * av_q2d(st->time_base) : 0.0;
}

// A native FLAC stream's frames (flac_frames.h), read through the input's AVIOContext, where its
// demuxer is FFmpeg's FLAC one; else nullopt (the demuxer's packets are read).
std::optional<FlacFrames> flac_frames(const Opened& o) {
  AVFormatContext* fmt = o.format.get();
  if (o.st->codecpar->codec_id != AV_CODEC_ID_FLAC || fmt->pb == nullptr ||
      std::strcmp(fmt->iformat->name, "flac") != 0)
    return std::nullopt;
  AVIOContext* pb = fmt->pb;
  const int64_t size = avio_size(pb);
  if (size <= 0) return std::nullopt;
  const int64_t demuxer_at = avio_tell(pb);  // where the demuxer reads on, should this not do
  std::optional<FlacFrames> frames = FlacFrames::open(
      [pb](int64_t pos, uint8_t* dst, int64_t n) -> int64_t {
        if (avio_seek(pb, pos, SEEK_SET) < 0) return -1;
        const int k = avio_read(pb, dst, static_cast<int>(std::min<int64_t>(n, INT_MAX)));
        return k >= 0 ? k : k == AVERROR_EOF ? 0 : -1;
      },
      size);
  if (!frames) avio_seek(pb, demuxer_at, SEEK_SET);
  return frames;
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

std::string resampler_name() {
  static const std::string name = [] {
    Swr s(swr_alloc());
    if (!s) return std::string("swr");
    av_opt_set_int(s.get(), "resampler", SWR_ENGINE_SOXR, 0);
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    av_opt_set_chlayout(s.get(), "in_chlayout", &mono, 0);
    av_opt_set_chlayout(s.get(), "out_chlayout", &mono, 0);
    av_opt_set_int(s.get(), "in_sample_rate", 44100, 0);
    av_opt_set_int(s.get(), "out_sample_rate", 16000, 0);
    av_opt_set_sample_fmt(s.get(), "in_sample_fmt", AV_SAMPLE_FMT_FLT, 0);
    av_opt_set_sample_fmt(s.get(), "out_sample_fmt", AV_SAMPLE_FMT_FLT, 0);
    return std::string(swr_init(s.get()) >= 0 ? "soxr" : "swr");
  }();
  return name;
}

std::string ffmpeg_versions() {
  auto v = [](const char* name, unsigned version) {
    return std::string(name) + " " + std::to_string(AV_VERSION_MAJOR(version)) + "." +
           std::to_string(AV_VERSION_MINOR(version)) + "." +
           std::to_string(AV_VERSION_MICRO(version));
  };
  return v("libavformat", avformat_version()) + ", " + v("libavcodec", avcodec_version()) + ", " +
         v("libswresample", swresample_version()) + ", " + v("libavutil", avutil_version());
}

namespace {
AudioInfo info_of(const Opened& o) {
  AudioInfo info;
  info.duration = stream_duration(o);
  info.sample_rate = o.st->codecpar->sample_rate;
  info.channels = o.st->codecpar->ch_layout.nb_channels;
  info.codec = o.decoder->name;
  return info;
}
}  // namespace

AudioInfo probe(const std::string& path) { return info_of(open_file(path)); }

AudioInfo probe(std::span<const std::byte> bytes, const std::string& name) {
  return info_of(open_memory(bytes, name));
}

struct AudioDecoder::Impl {
  Frame frame{av_frame_alloc()};
  Packet packet{av_packet_alloc()};
  std::vector<float> resampled;  // interleaved, the file's channels

  // Everything after the input is open, for a file and for bytes in memory alike. `path` names
  // the input in errors; t0: when opening it began (decode time counts it).
  int decode(Opened& o, const std::string& path, double offset, double duration,
             const DecodeOptions& options, std::vector<float>& out, DecodeTimes* times,
             Clock::time_point t0);
};

AudioDecoder::AudioDecoder() : impl_(std::make_unique<Impl>()) {}
AudioDecoder::~AudioDecoder() = default;

namespace {
void check_cut(const std::string& name, double offset, const DecodeOptions& options) {
  if (!(offset >= 0) || options.sample_rate <= 0 || !(options.speed > 0))
    throw InvalidArgument(name + ": a cut needs offset >= 0, a positive rate and speed");
}
}  // namespace

int AudioDecoder::decode(const std::string& path, double offset, double duration,
                         const DecodeOptions& options, std::vector<float>& out,
                         DecodeTimes* times) {
  check_cut(path, offset, options);
  const Clock::time_point t0 = Clock::now();
  Opened o = open_file(path);
  return impl_->decode(o, path, offset, duration, options, out, times, t0);
}

int AudioDecoder::decode(std::span<const std::byte> bytes, const std::string& name, double offset,
                         double duration, const DecodeOptions& options, std::vector<float>& out,
                         DecodeTimes* times) {
  check_cut(name, offset, options);
  const Clock::time_point t0 = Clock::now();
  Opened o = open_memory(bytes, name);
  return impl_->decode(o, name, offset, duration, options, out, times, t0);
}

int AudioDecoder::Impl::decode(Opened& o, const std::string& path, double offset, double duration,
                               const DecodeOptions& options, std::vector<float>& out,
                               DecodeTimes* times, Clock::time_point t0) {
  double resample_s = 0;
  AVFormatContext* fmt = o.format.get();
  const AVStream* st = o.st;
  const double total = stream_duration(o);
  Codec codec(avcodec_alloc_context3(o.decoder));
  if (!codec || avcodec_parameters_to_context(codec.get(), st->codecpar) < 0)
    throw DecodeError(path + ": cannot set up its " + o.decoder->name + " decoder");
  codec->thread_count = 1;
  // With the packets' time base, the decoder moves a frame's timestamp past the samples it skips
  // (Opus's pre-skip, MP3's encoder delay), so that timestamps trim a cut exactly.
  codec->pkt_timebase = st->time_base;
  if (int err = avcodec_open2(codec.get(), o.decoder, nullptr); err < 0)
    throw DecodeError(path + ": cannot open its " + o.decoder->name + " decoder (" +
                      av_message(err) + ")");
  const double start = stream_start(st);
  std::optional<FlacFrames> flac = flac_frames(o);
  // FFmpeg's WAV demuxer asks for a PCM stream's packets to be probed again (for MP3 or S/PDIF
  // data mislabelled as PCM), up to the context's probesize (5 MB): every demuxer's probe over
  // ever larger buffers, most of a short WAV's decode. The header has been read and the stream
  // is known: its first packet is probed alone.
  fmt->probesize = 32;
  bool flac_end = false;  // its seek found no frame: the offset is past its end
  if (offset > 0 && flac) {
    flac_end = !flac->seek(static_cast<uint64_t>(std::floor(offset * flac->info().rate)));
  } else if (offset > 0) {
    const double at =
        std::max(0.0, offset - (needs_preroll(st->codecpar->codec_id) ? kPreroll : 0)) + start;
    const auto ts = static_cast<int64_t>(std::floor(at / av_q2d(st->time_base)));
    // A file that cannot seek is read from its start: the trim below still cuts by timestamp.
    if (av_seek_frame(fmt, o.stream, ts, AVSEEK_FLAG_BACKWARD) >= 0)
      avcodec_flush_buffers(codec.get());
  }
  // The next packet: a FLAC frame stamped with its first sample, else the demuxer's.
  auto read_packet = [&](AVPacket* p) -> int {
    if (!flac) return av_read_frame(fmt, p);
    std::span<const uint8_t> bytes;
    uint64_t first = 0;
    if (flac_end || !flac->next(&bytes, &first)) return AVERROR_EOF;
    if (int err = av_new_packet(p, static_cast<int>(bytes.size())); err < 0) return err;
    std::memcpy(p->data, bytes.data(), bytes.size());
    p->pts = p->dts =
        av_rescale_q(static_cast<int64_t>(first),
                     AVRational{1, static_cast<int>(flac->info().rate)}, st->time_base) +
        (st->start_time != AV_NOPTS_VALUE ? st->start_time : 0);
    p->stream_index = o.stream;
    return 0;
  };

  Swr swr;
  int channels = 0;
  int in_rate = 0;
  int64_t begin = 0, end = INT64_MAX;  // the cut, in samples at the file's rate
  int64_t next = -1;                   // the sample after the last frame's
  int64_t fed = 0;
  int64_t decoded = 0;  // samples out of the decoder
  auto& res = resampled;
  res.clear();
  AVFrame* av_frame = frame.get();
  AVPacket* av_packet = packet.get();
  bool done = false;

  auto convert = [&](const uint8_t** in, int count) {
    const Clock::time_point r0 = Clock::now();
    const int room = swr_get_out_samples(swr.get(), count);
    if (room < 0) throw DecodeError(path + ": cannot resample (" + av_message(room) + ")");
    const size_t have = res.size();
    res.resize(have + static_cast<size_t>(room) * channels);
    auto* dst = reinterpret_cast<uint8_t*>(res.data() + have);
    const int got = swr_convert(swr.get(), &dst, room, in, count);
    if (got < 0) throw DecodeError(path + ": cannot resample (" + av_message(got) + ")");
    res.resize(have + static_cast<size_t>(got) * channels);
    resample_s += since(r0);
  };

  auto take = [&](const AVFrame* f) {
    if (!swr) {
      channels = f->ch_layout.nb_channels;
      in_rate = f->sample_rate;
      if (channels <= 0 || in_rate <= 0)
        throw DecodeError(path + ": its frames have no channels or no rate");
      begin = std::llround(offset * in_rate);
      if (duration > 0) end = std::llround((offset + duration) * in_rate);
      SwrContext* raw = nullptr;
      AVChannelLayout layout{};
      av_channel_layout_default(&layout, channels);
      // Speed: the samples as they are, taken to be at another rate (Lhotse rounds it too).
      const long long as_rate =
          options.speed == 1 ? in_rate : std::llround(in_rate * options.speed);
      if (as_rate <= 0 || as_rate > INT32_MAX)
        throw DecodeError(path + ": no rate to resample from at speed " +
                          std::to_string(options.speed));
      if (swr_alloc_set_opts2(&raw, &layout, AV_SAMPLE_FMT_FLT, options.sample_rate, &layout,
                              static_cast<AVSampleFormat>(f->format), static_cast<int>(as_rate), 0,
                              nullptr) < 0)
        throw DecodeError(path + ": cannot set up the resampler");
      swr.reset(raw);
      if (resampler_name() == "soxr") av_opt_set_int(raw, "resampler", SWR_ENGINE_SOXR, 0);
      if (int err = swr_init(raw); err < 0)
        throw DecodeError(path + ": cannot set up the resampler (" + av_message(err) + ")");
      // Room for the whole cut at once (a little over, for the resampler's rounding): growing
      // by doubling would copy it and map fresh pages a few times over.
      // (No more than the stream says is left: a manifest's duration may be wrong.)
      const double left = std::max(total - offset, 0.0);
      const double seconds = duration > 0 && total > 0 ? std::min(duration, left)
                             : duration > 0            ? duration
                                                       : left;
      const double frames = seconds / options.speed * options.sample_rate + 64;
      if (frames < (1u << 26) / static_cast<unsigned>(channels))  // up to 256 MiB at once
        res.reserve(static_cast<size_t>(frames) * static_cast<size_t>(channels));
    } else if (f->ch_layout.nb_channels != channels || f->sample_rate != in_rate) {
      throw DecodeError(path + ": its channels or rate change at t=" +
                        seconds_text(next / static_cast<double>(in_rate)) + " s");
    }
    int64_t pos = next;
    const int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
    if (pts != AV_NOPTS_VALUE) {
      pos = std::llround((pts * av_q2d(st->time_base) - start) * in_rate);
    } else if (pos < 0) {
      pos = 0;
    }
    next = pos + f->nb_samples;
    decoded += f->nb_samples;
    const int64_t lo = std::clamp<int64_t>(begin - pos, 0, f->nb_samples);
    const int64_t hi = std::clamp<int64_t>(end - pos, 0, f->nb_samples);
    if (pos >= end) done = true;
    if (hi <= lo) return;
    const auto format = static_cast<AVSampleFormat>(f->format);
    const int bytes = av_get_bytes_per_sample(format);
    const bool planar = av_sample_fmt_is_planar(format);
    std::vector<const uint8_t*> planes(planar ? channels : 1);
    for (size_t c = 0; c < planes.size(); ++c)
      planes[c] = f->extended_data[c] + lo * bytes * (planar ? 1 : channels);
    convert(planes.data(), static_cast<int>(hi - lo));
    fed += hi - lo;
    if (pos + f->nb_samples >= end) done = true;
  };

  auto receive = [&] {
    while (!done) {
      const int err = avcodec_receive_frame(codec.get(), av_frame);
      if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return;
      if (err < 0) {
        throw DecodeError(path + ": corrupt audio near t=" +
                          seconds_text(next > 0 ? next / static_cast<double>(in_rate) : offset) +
                          " s (" + av_message(err) + ")");
      }
      take(av_frame);
      av_frame_unref(av_frame);
    }
  };

  while (!done) {
    const int err = read_packet(av_packet);
    if (err == AVERROR_EOF) break;
    if (err < 0) {
      throw DecodeError(
          path + ": cannot read near t=" +
          seconds_text(next > 0 && in_rate > 0 ? next / static_cast<double>(in_rate) : offset) +
          " s (" + av_message(err) + ")");
    }
    if (av_packet->stream_index != o.stream) {
      av_packet_unref(av_packet);
      continue;
    }
    const int sent = avcodec_send_packet(codec.get(), av_packet);
    av_packet_unref(av_packet);
    if (sent < 0 && sent != AVERROR(EAGAIN)) {
      throw DecodeError(
          path + ": corrupt audio near t=" +
          seconds_text(next > 0 && in_rate > 0 ? next / static_cast<double>(in_rate) : offset) +
          " s (" + av_message(sent) + ")");
    }
    receive();
  }
  if (!done) {  // the decoder's last frames
    avcodec_send_packet(codec.get(), nullptr);
    receive();
  }
  if (!swr || fed == 0) {  // (a header's duration may be wrong: only decoding tells)
    const double last = next > 0 && in_rate > 0 ? next / static_cast<double>(in_rate) : total;
    if (offset > 0 && last > 0 && offset >= last) {
      throw DecodeError(path + ": offset t=" + seconds_text(offset) +
                        " s is past the end (t=" + seconds_text(last) + " s)");
    }
    throw DecodeError(path + ": no audio from t=" + seconds_text(offset) + " s" +
                      (total > 0 ? " (it ends at t=" + seconds_text(total) + " s)" : ""));
  }
  convert(nullptr, 0);  // the resampler's tail
  const double decode_s = since(t0) - resample_s;

  const Clock::time_point m0 = Clock::now();
  const size_t n = res.size() / channels;
  if (options.mono && channels > 1) {
    out.resize(n);
    const float scale = 1.0f / channels;
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int c = 0; c < channels; ++c) sum += res[i * channels + c];
      out[i] = sum * scale;
    }
  } else {
    // Handed over, not copied: `out` takes the samples and `res` the caller's old buffer (the
    // worker's own, reused at the next call: both keep their capacity).
    out.swap(res);
  }
  if (times != nullptr) {
    times->decode += decode_s;
    times->resample += resample_s + since(m0);
    times->decoded += static_cast<double>(decoded) / in_rate;
  }
  return options.mono ? 1 : channels;
}

}  // namespace stoker::audio
