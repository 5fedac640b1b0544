#include "test_videos.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
}

namespace stoker::video::testing {
namespace {

void check(int rc, const char* what) {
  if (rc < 0) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(rc, buf, sizeof buf);
    throw std::runtime_error(std::string("write_test_video: ") + what + ": " + buf);
  }
}

struct Output {
  AVFormatContext* format = nullptr;
  AVCodecContext* codec = nullptr;
  AVFrame* frame = nullptr;
  AVPacket* packet = nullptr;
  ~Output() {
    av_frame_free(&frame);
    av_packet_free(&packet);
    avcodec_free_context(&codec);
    if (format != nullptr) {
      if (format->pb != nullptr) avio_closep(&format->pb);
      avformat_free_context(format);
    }
  }
};

void drain(Output& o, AVStream* st, AVFrame* frame) {
  check(avcodec_send_frame(o.codec, frame), "send_frame");
  while (true) {
    const int rc = avcodec_receive_packet(o.codec, o.packet);
    if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
    check(rc, "receive_packet");
    av_packet_rescale_ts(o.packet, o.codec->time_base, st->time_base);
    o.packet->stream_index = st->index;
    check(av_interleaved_write_frame(o.format, o.packet), "write_frame");
  }
}

}  // namespace

int test_luma(int frame) { return 24 + 3 * (frame % 64); }
int rgb_of_luma(int luma) {
  return std::clamp(static_cast<int>(std::lround((luma - 16) * 255.0 / 219.0)), 0, 255);
}
int frame_of_rgb(int rgb, int frames) {
  int best = 0, dist = 1 << 30;
  for (int i = 0; i < frames; ++i) {
    const int d = std::abs(rgb_of_luma(test_luma(i)) - rgb);
    if (d < dist) dist = d, best = i;
  }
  return best;
}

void write_test_video(const std::string& path, const TestVideo& spec) {
  Output o;
  check(avformat_alloc_output_context2(&o.format, nullptr, nullptr, path.c_str()), "container");
  const bool video = !spec.audio_only;
  const AVCodec* codec = video ? avcodec_find_encoder_by_name(spec.codec.c_str())
                               : avcodec_find_encoder(AV_CODEC_ID_PCM_S16LE);
  if (codec == nullptr) throw std::runtime_error("write_test_video: no encoder " + spec.codec);
  AVStream* st = avformat_new_stream(o.format, nullptr);
  o.codec = avcodec_alloc_context3(codec);
  o.frame = av_frame_alloc();
  o.packet = av_packet_alloc();
  if (video) {
    o.codec->width = spec.width;
    o.codec->height = spec.height;
    o.codec->pix_fmt = AV_PIX_FMT_YUV420P;
    o.codec->time_base = {1, spec.fps};
    o.codec->framerate = {spec.fps, 1};
    o.codec->gop_size = spec.gop;
    o.codec->max_b_frames = spec.b_frames;
    o.codec->flags |= AV_CODEC_FLAG_QSCALE;
    o.codec->global_quality = FF_QP2LAMBDA * 2;
  } else {
    o.codec->sample_fmt = AV_SAMPLE_FMT_S16;
    o.codec->sample_rate = 8000;
    av_channel_layout_default(&o.codec->ch_layout, 1);
    o.codec->time_base = {1, 8000};
  }
  if (o.format->oformat->flags & AVFMT_GLOBALHEADER) o.codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  check(avcodec_open2(o.codec, codec, nullptr), "open encoder");
  check(avcodec_parameters_from_context(st->codecpar, o.codec), "parameters");
  st->time_base = o.codec->time_base;
  check(avio_open(&o.format->pb, path.c_str(), AVIO_FLAG_WRITE), "open file");
  // No edit list in mp4: with one, FFmpeg 5's demuxer drops the last frame of a stream with
  // B-frames (its packet comes marked discarded); the tests count on every frame.
  AVDictionary* options = nullptr;
  av_dict_set(&options, "use_editlist", "0", 0);
  const int header = avformat_write_header(o.format, &options);
  av_dict_free(&options);
  check(header, "header");
  if (video) {
    o.frame->format = AV_PIX_FMT_YUV420P;
    o.frame->width = spec.width;
    o.frame->height = spec.height;
    check(av_frame_get_buffer(o.frame, 0), "frame buffer");
    for (int i = 0; i < spec.frames; ++i) {
      check(av_frame_make_writable(o.frame), "writable");
      const int luma = test_luma(i);
      for (int y = 0; y < spec.height; ++y)
        for (int x = 0; x < spec.width; ++x) {
          const int sx = (i * 2) % std::max(1, spec.width - 8), sy = spec.height / 4;
          const bool square = x >= sx && x < sx + 8 && y >= sy && y < sy + 8;
          o.frame->data[0][y * o.frame->linesize[0] + x] = square ? 235 : luma;
        }
      for (int p = 1; p < 3; ++p)
        for (int y = 0; y < spec.height / 2; ++y)
          for (int x = 0; x < spec.width / 2; ++x)
            o.frame->data[p][y * o.frame->linesize[p] + x] = 128;
      o.frame->pts = i;
      drain(o, st, o.frame);
    }
  } else {
    o.frame->format = AV_SAMPLE_FMT_S16;
    o.frame->nb_samples = 800;
    o.frame->sample_rate = 8000;
    check(av_channel_layout_copy(&o.frame->ch_layout, &o.codec->ch_layout), "layout");
    check(av_frame_get_buffer(o.frame, 0), "audio buffer");
    for (int i = 0; i < 10; ++i) {
      check(av_frame_make_writable(o.frame), "writable");
      std::fill_n(o.frame->data[0], 800 * 2, uint8_t{0});
      o.frame->pts = i * 800;
      drain(o, st, o.frame);
    }
  }
  drain(o, st, nullptr);
  check(av_write_trailer(o.format), "trailer");
}

}  // namespace stoker::video::testing
