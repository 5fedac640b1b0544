#include "stoker/text/text_corpus.h"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "stoker/errors.h"
#include "stoker/text/tokenizer.h"
#include "text/arrow_rows.h"
#include "text/byte_stream.h"
#include "text/row_encoder.h"

namespace stoker::text {
namespace {

constexpr size_t kLinesPerTask = 1 << 18;  // bytes of JSONL lines a task encodes
constexpr uint64_t kArrowRowsPerTask = 64;
constexpr size_t kReasonsKept = 8;
constexpr const char* kFiles[] = {"tokens.u32", "trained.u8", "starts.u64", "rows.u64"};
enum FileIndex { kTokens, kTrained, kStarts, kRows, kNumFiles };

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// A store file being written: appended to through a buffer.
class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Named: `path`; unnamed: an anonymous file in `dir`, gone when closed.
  void open_named(const std::string& path) {
    name_ = path;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(system_error("cannot create " + path));
  }
  void open_unnamed(const std::string& dir) {
    name_ = "a temporary file in " + dir;
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) {  // a file system without O_TMPFILE: a named file, unlinked at once
      std::string path = dir + "/stoker-text-XXXXXX";
      fd_ = ::mkstemp(path.data());
      if (fd_ < 0) throw IoError(system_error("cannot create " + name_));
      ::unlink(path.c_str());
    }
  }

  void append(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    if (buffer_.size() + n > kFlushAt) flush();
    if (n > kFlushAt) {
      write_all(p, n);
    } else {
      buffer_.insert(buffer_.end(), p, p + n);
    }
    size_ += n;
  }
  void flush() {
    write_all(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw IoError(system_error("cannot write " + name_));
      p += w, n -= static_cast<size_t>(w);
    }
  }
  std::string name_;
  int fd_ = -1;
  std::vector<char> buffer_;
  uint64_t size_ = 0;
};

// A read-only mapping of a whole store file.
struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(int fd, size_t bytes, const std::string& name) : size(bytes) {
    if (bytes == 0) return;
    data = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      data = nullptr;
      throw IoError(system_error("cannot map " + name));
    }
  }
  Mapping(Mapping&& o) noexcept : data(std::exchange(o.data, nullptr)), size(o.size) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(data, o.data);
    std::swap(size, o.size);
    return *this;
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
};

void json_escape(std::string_view s, std::string& out) {
  out.push_back('"');
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace

struct TextCorpus::Store {
  Mapping files[kNumFiles];
};

TextCorpus::TextCorpus(std::unique_ptr<Store> store, std::vector<Origin> origins,
                       TextCorpusStats stats)
    : store_(std::move(store)), origins_(std::move(origins)), stats_(std::move(stats)) {
  num_documents_ = stats_.documents;
  num_tokens_ = stats_.tokens;
  static const uint64_t kNoDocuments[1] = {0};
  tokens_ = static_cast<const uint32_t*>(store_->files[kTokens].data);
  trained_ = static_cast<const uint8_t*>(store_->files[kTrained].data);
  starts_ = store_->files[kStarts].data != nullptr
                ? static_cast<const uint64_t*>(store_->files[kStarts].data)
                : kNoDocuments;
  rows_ = static_cast<const uint64_t*>(store_->files[kRows].data);
}

TextCorpus::~TextCorpus() = default;

void TextCorpus::read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const {
  const uint32_t* t = tokens_ + starts_[d] + offset;
  for (uint64_t i = 0; i < count; ++i) out[i] = t[i];
}

void TextCorpus::read_trained(uint64_t d, uint64_t offset, uint64_t count, uint8_t* out) const {
  if (trained_ == nullptr) {
    std::memset(out, 1, count);
    return;
  }
  std::memcpy(out, trained_ + starts_[d] + offset, count);
}

std::vector<uint8_t> TextCorpus::trained(uint64_t d) const {
  std::vector<uint8_t> out(document_length(d));
  read_trained(d, 0, out.size(), out.data());
  return out;
}

std::pair<size_t, uint64_t> TextCorpus::row_of(uint64_t d) const {
  const auto it =
      std::upper_bound(origins_.begin(), origins_.end(), d,
                       [](uint64_t v, const Origin& o) { return v < o.first_document; });
  return {it == origins_.begin() ? 0 : static_cast<size_t>(it - origins_.begin() - 1), rows_[d]};
}

std::string TextCorpus::path(uint64_t d) const {
  if (origins_.empty()) return {};
  const Origin& o = origins_[row_of(d).first];
  return o.lines ? o.name + ":" + std::to_string(rows_[d])
                 : o.name + ": row " + std::to_string(rows_[d]);
}

std::shared_ptr<TextCorpus> TextCorpus::open(const std::string& store_dir) {
  const std::string index_path = store_dir + "/index.json";
  simdjson::dom::parser parser;
  simdjson::padded_string text;  // (parser.load() trips GCC's -Wmaybe-uninitialized at -O3)
  simdjson::dom::element index;
  if (simdjson::padded_string::load(index_path).get(text) != simdjson::SUCCESS ||
      parser.parse(text).get(index) != simdjson::SUCCESS)
    throw IoError("no complete text store in " + store_dir + " (index.json missing or unreadable)");
  TextCorpusStats stats;
  std::vector<Origin> origins;
  bool trained = false;
  try {
    stats.rows = index["rows"].get_uint64();
    stats.documents = index["documents"].get_uint64();
    stats.tokens = index["tokens"].get_uint64();
    stats.trained_tokens = index["trained_tokens"].get_uint64();
    stats.truncated = index["truncated"].get_uint64();
    stats.skipped = index["skipped"].get_uint64();
    for (auto r : index["skipped_reasons"].get_array())
      stats.skipped_reasons.emplace_back(std::string_view(r.get_string()));
    trained = index["trained"].get_bool();
    for (auto o : index["origins"].get_array())
      origins.push_back({std::string(std::string_view(o["name"].get_string())),
                         o["lines"].get_bool(), o["first_document"].get_uint64()});
  } catch (const simdjson::simdjson_error& e) {
    throw IoError(index_path + " is not a text store's index (" + e.what() + ")");
  }
  const uint64_t expected[kNumFiles] = {stats.tokens * 4, trained ? stats.tokens : 0,
                                        (stats.documents + 1) * 8, stats.documents * 8};
  auto store = std::make_unique<Store>();
  for (int f = 0; f < kNumFiles; ++f) {
    if (f == kTrained && !trained) continue;
    const std::string path = store_dir + "/" + kFiles[f];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(system_error("text store " + store_dir + ": cannot open " + path));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expected[f]) {
      ::close(fd);
      throw IoError("text store " + store_dir + ": " + kFiles[f] + " has " +
                    std::to_string(st.st_size) + " bytes, the index says " +
                    std::to_string(expected[f]) + " (an incomplete store)");
    }
    try {
      store->files[f] = Mapping(fd, expected[f], path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  return std::make_shared<TextCorpus>(std::move(store), std::move(origins), std::move(stats));
}

// ---------------------------------------------------------------------------------------------

class TextCorpusBuilder::Impl {
 public:
  Impl(const Tokenizer& tokenizer, RowFormat format, std::string store_dir, bool skip, int threads)
      : format_(std::move(format)),
        encoder_(tokenizer, format_),
        store_dir_(std::move(store_dir)),
        skip_(skip) {
    if (format_.messages && format_.chat_template == nullptr)
      throw InvalidArgument("a corpus of conversations needs a chat template");
    open_store();
    uint64_t zero = 0;
    files_[kStarts].append(&zero, sizeof zero);
    const int n = std::max(1, threads);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
    max_waiting_ = 2 * static_cast<size_t>(n) + 2;
  }

  ~Impl() { stop_workers(); }

  void add_jsonl(const std::string& path, const std::string& origin) {
    const auto o = add_origin(origin, true);
    auto in = ByteStream::open(path, origin);
    std::string pending;  // bytes after the last newline read
    std::vector<char> block(kLinesPerTask);
    uint64_t line = 1;
    for (;;) {
      const size_t n = in->read(block.data(), block.size());
      if (n == 0) break;
      pending.append(block.data(), n);
      if (pending.size() < kLinesPerTask) continue;
      const size_t cut = pending.rfind('\n');
      if (cut == std::string::npos) continue;  // one long line, still growing
      std::string lines = pending.substr(0, cut + 1);
      pending.erase(0, cut + 1);
      const uint64_t count = static_cast<uint64_t>(std::count(lines.begin(), lines.end(), '\n'));
      Task t;
      t.origin = o;
      t.lines = std::move(lines);
      t.first_line = line;
      line += count;
      submit(std::move(t));
    }
    if (!pending.empty()) {
      Task t;
      t.origin = o;
      t.lines = std::move(pending);
      t.first_line = line;
      submit(std::move(t));
    }
    rethrow_if_failed();
  }

  void add_arrow(ArrowArray* array, ArrowSchema* schema, const std::string& origin,
                 uint64_t first_row) {
    auto rows = std::make_shared<const ArrowRows>(array, schema);
    const int column = rows->column(format_.field);
    if (column < 0)
      throw InvalidArgument(origin + ": no column \"" + format_.field +
                            "\" (columns: " + rows->column_names() + ")");
    const int tools = format_.messages ? rows->column("tools") : -1;
    const auto o = add_origin(origin, false, first_row);
    for (uint64_t b = 0; b < rows->size(); b += kArrowRowsPerTask) {
      Task t;
      t.origin = o;
      t.rows = rows;
      t.column = column;
      t.tools = tools;
      t.begin = b;
      t.end = std::min(rows->size(), b + kArrowRowsPerTask);
      t.first_line = first_row;
      submit(std::move(t));
    }
    rethrow_if_failed();
  }

  std::shared_ptr<TextCorpus> finish() {
    {
      std::unique_lock lock(mu_);
      space_.wait(lock, [&] { return waiting_ == 0 || failed_; });
    }
    stop_workers();
    rethrow_if_failed();
    for (auto& f : files_) f.flush();
    for (; origins_started_ < origins_.size(); ++origins_started_)  // origins without rows
      origins_[origins_started_].first_document = stats_.documents;
    auto store = std::make_unique<TextCorpus::Store>();
    for (int f = 0; f < kNumFiles; ++f) {
      if (f == kTrained && !format_.assistant_only) continue;
      store->files[f] = Mapping(files_[f].fd(), files_[f].size(), kFiles[f]);
    }
    if (!store_dir_.empty()) write_index();
    return std::make_shared<TextCorpus>(std::move(store), std::move(origins_), stats_);
  }

 private:
  struct Task {
    uint64_t seq = 0;
    std::shared_ptr<const std::string> origin;  // its name
    std::string lines;                          // JSONL: whole lines
    uint64_t first_line = 0;  // JSONL: the first line's number; Arrow: the batch's first row's
    std::shared_ptr<const ArrowRows> rows;
    int column = -1, tools = -1;
    uint64_t begin = 0, end = 0;
  };
  struct Bad {
    uint64_t row = 0;  // among the task's rows
    std::string path;
    std::exception_ptr cause;
  };
  struct Result {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> trained;
    std::vector<uint64_t> lengths, rows;
    uint64_t rows_met = 0, trained_tokens = 0, truncated = 0;
    std::vector<Bad> bad;
  };

  // The origin's name, shared by its tasks.
  std::shared_ptr<const std::string> add_origin(const std::string& name, bool lines,
                                                uint64_t first_row = 0) {
    std::lock_guard lock(mu_);
    // Arrow batches of one origin follow each other: one origin, rows numbered on.
    if (lines || origins_.empty() || origins_.back().lines || origins_.back().name != name ||
        first_row == 0) {
      origins_.push_back({name, lines, 0});
      origin_first_task_.push_back(next_seq_);
      origin_name_ = std::make_shared<const std::string>(name);
    }
    return origin_name_;
  }

  void open_store() {
    if (!store_dir_.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(store_dir_, ec);
      if (ec) throw IoError("cannot create the text store " + store_dir_ + ": " + ec.message());
    }
    const std::string tmp = [] {
      const char* t = std::getenv("TMPDIR");
      return std::string(t != nullptr && *t != '\0' ? t : "/tmp");
    }();
    for (int f = 0; f < kNumFiles; ++f) {
      if (f == kTrained && !format_.assistant_only) continue;
      if (store_dir_.empty()) {
        files_[f].open_unnamed(tmp);
      } else {
        files_[f].open_named(store_dir_ + "/" + kFiles[f]);
      }
    }
  }

  void submit(Task t) {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return waiting_ < max_waiting_ || failed_; });
    if (failed_) return;
    t.seq = next_seq_++;
    ++waiting_;
    tasks_.push_back(std::move(t));
    ready_.notify_one();
  }

  void rethrow_if_failed() {
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }

  void stop_workers() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  void work() {
    simdjson::dom::parser parser;
    EncodedRow row;
    std::string messages, tools;
    for (;;) {
      Task t;
      {
        std::unique_lock lock(mu_);
        ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      Result r;
      try {
        if (!failed_) encode(t, parser, row, messages, tools, r);
      } catch (...) {  // not a row's failure (out of memory, say): the whole build's
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
        failed_ = true;
      }
      commit(t.seq, std::move(r));
    }
  }

  void keep(EncodedRow& row, uint64_t number, Result& r) {
    r.tokens.insert(r.tokens.end(), row.ids.begin(), row.ids.end());
    if (format_.assistant_only) {
      r.trained.insert(r.trained.end(), row.trained.begin(), row.trained.end());
      r.trained_tokens +=
          static_cast<uint64_t>(std::count(row.trained.begin(), row.trained.end(), 1));
    } else {
      r.trained_tokens += row.ids.size();
    }
    r.lengths.push_back(row.ids.size());
    r.rows.push_back(number);
    r.truncated += row.truncated;
  }

  // Encodes one row, or records it as bad. False: stop the task (a bad row, not skipping).
  template <typename Fn>
  bool row(Fn&& fn, uint64_t number, const std::string& origin, bool lines, EncodedRow& out,
           Result& r) {
    ++r.rows_met;
    try {
      out.ids.clear();
      out.trained.clear();
      out.truncated = false;
      fn();
      keep(out, number, r);
      return true;
    } catch (...) {
      r.bad.push_back({r.rows_met - 1,
                       lines ? origin + ":" + std::to_string(number)
                             : origin + ": row " + std::to_string(number),
                       std::current_exception()});
      return skip_;
    }
  }

  void encode(const Task& t, simdjson::dom::parser& parser, EncodedRow& out, std::string& messages,
              std::string& tools, Result& r) {
    if (t.rows != nullptr) {
      const ArrowRows& rows = *t.rows;
      for (uint64_t i = t.begin; i < t.end; ++i) {
        const auto fn = [&] {
          if (rows.is_null(t.column, i))
            throw InvalidArgument("the field \"" + format_.field + "\" is null");
          if (!format_.messages) return encoder_.encode_text(rows.string(t.column, i), out);
          messages.clear();
          tools.clear();
          rows.json(t.column, i, messages);
          if (t.tools >= 0 && !rows.is_null(t.tools, i)) rows.json(t.tools, i, tools);
          encoder_.encode_messages(messages, tools, out);
        };
        if (!row(fn, t.first_line + i, *t.origin, false, out, r)) return;
      }
      return;
    }
    std::string_view rest = t.lines;
    for (uint64_t number = t.first_line; !rest.empty(); ++number) {
      const size_t eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // not a row
      const auto fn = [&] { encode_line(line, parser, messages, tools, out); };
      if (!row(fn, number, *t.origin, true, out, r)) return;
    }
  }

  void encode_line(std::string_view line, simdjson::dom::parser& parser, std::string& messages,
                   std::string& tools, EncodedRow& out) {
    simdjson::dom::element doc;
    if (const auto e = parser.parse(line.data(), line.size()).get(doc); e != simdjson::SUCCESS)
      throw DecodeError(std::string("not a JSON line (") + simdjson::error_message(e) + ")");
    simdjson::dom::object object;
    if (doc.get(object) != simdjson::SUCCESS) throw DecodeError("the line is not a JSON object");
    simdjson::dom::element value;
    if (object[format_.field].get(value) != simdjson::SUCCESS) {
      std::string keys;
      for (auto [k, v] : object) keys += (keys.empty() ? "" : ", ") + std::string(k);
      throw InvalidArgument("no field \"" + format_.field + "\" (fields: " + keys + ")");
    }
    if (!format_.messages) {
      std::string_view text;
      if (value.get(text) != simdjson::SUCCESS)
        throw InvalidArgument("the field \"" + format_.field + "\" is " + type_name(value) +
                              ", not a string");
      return encoder_.encode_text(text, out);
    }
    if (!value.is_array())
      throw InvalidArgument("the field \"" + format_.field + "\" is " + type_name(value) +
                            ", not a list of messages");
    messages = simdjson::minify(value);
    tools.clear();
    simdjson::dom::element t;
    if (object["tools"].get(t) == simdjson::SUCCESS && !t.is_null()) tools = simdjson::minify(t);
    encoder_.encode_messages(messages, tools, out);
  }

  static std::string type_name(simdjson::dom::element v) {
    switch (v.type()) {
      case simdjson::dom::element_type::ARRAY:
        return "a list";
      case simdjson::dom::element_type::OBJECT:
        return "an object";
      case simdjson::dom::element_type::STRING:
        return "a string";
      case simdjson::dom::element_type::BOOL:
        return "a bool";
      case simdjson::dom::element_type::NULL_VALUE:
        return "null";
      default:
        return "a number";
    }
  }

  // Results are written in task order, whichever thread finishes first.
  void commit(uint64_t seq, Result r) {
    std::lock_guard lock(mu_);
    results_.emplace(seq, std::move(r));
    for (auto it = results_.find(next_commit_); it != results_.end();
         it = results_.find(next_commit_)) {
      Result& done = it->second;
      if (!failed_) write(done);
      results_.erase(it);
      ++next_commit_;
      --waiting_;
    }
    space_.notify_all();
  }

  void write(Result& r) {  // REQUIRES: mu_ held
    const uint64_t first_document = stats_.documents;
    // Origins starting at this task get their first document now.
    while (origins_started_ < origins_.size() &&
           origin_first_task_[origins_started_] <= next_commit_) {
      origins_[origins_started_].first_document = first_document;
      ++origins_started_;
    }
    if (!skip_ && !r.bad.empty()) {
      const Bad& b = r.bad.front();
      error_ = std::make_exception_ptr(SampleError(stats_.rows + b.row, b.path, b.cause));
      failed_ = true;
      return;
    }
    for (const Bad& b : r.bad) {
      if (stats_.skipped_reasons.size() < kReasonsKept)
        stats_.skipped_reasons.push_back(b.path + ": " + SampleError::message_of(b.cause));
    }
    try {
      files_[kTokens].append(r.tokens.data(), r.tokens.size() * sizeof(uint32_t));
      if (format_.assistant_only) files_[kTrained].append(r.trained.data(), r.trained.size());
      uint64_t end = stats_.tokens;
      for (const uint64_t n : r.lengths) {
        end += n;
        files_[kStarts].append(&end, sizeof end);
      }
      files_[kRows].append(r.rows.data(), r.rows.size() * sizeof(uint64_t));
    } catch (...) {
      error_ = std::current_exception();
      failed_ = true;
      return;
    }
    stats_.rows += r.rows_met;
    stats_.documents += r.lengths.size();
    stats_.tokens += r.tokens.size();
    stats_.trained_tokens += r.trained_tokens;
    stats_.truncated += r.truncated;
    stats_.skipped += r.bad.size();
  }

  void write_index() {
    std::string s = "{\"version\": 1, \"rows\": " + std::to_string(stats_.rows) +
                    ", \"documents\": " + std::to_string(stats_.documents) +
                    ", \"tokens\": " + std::to_string(stats_.tokens) +
                    ", \"trained_tokens\": " + std::to_string(stats_.trained_tokens) +
                    ", \"truncated\": " + std::to_string(stats_.truncated) +
                    ", \"skipped\": " + std::to_string(stats_.skipped) +
                    ", \"trained\": " + (format_.assistant_only ? "true" : "false") +
                    ", \"skipped_reasons\": [";
    for (size_t i = 0; i < stats_.skipped_reasons.size(); ++i) {
      if (i > 0) s += ", ";
      json_escape(stats_.skipped_reasons[i], s);
    }
    s += "], \"origins\": [";
    for (size_t i = 0; i < origins_.size(); ++i) {
      if (i > 0) s += ", ";
      s += "{\"name\": ";
      json_escape(origins_[i].name, s);
      s += ", \"lines\": " + std::string(origins_[i].lines ? "true" : "false") +
           ", \"first_document\": " + std::to_string(origins_[i].first_document) + "}";
    }
    s += "]}\n";
    const std::string path = store_dir_ + "/index.json";
    std::ofstream out(path, std::ios::binary);
    out << s;
    out.close();
    if (!out) throw IoError("cannot write " + path);
  }

  RowFormat format_;
  RowEncoder encoder_;
  std::string store_dir_;
  bool skip_;
  OutFile files_[kNumFiles];

  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<Task> tasks_;
  size_t waiting_ = 0, max_waiting_ = 0;  // tasks submitted and not yet committed
  uint64_t next_seq_ = 0, next_commit_ = 0;
  std::map<uint64_t, Result> results_;
  std::vector<TextCorpus::Origin> origins_;
  std::vector<uint64_t> origin_first_task_;  // each origin's first task
  std::shared_ptr<const std::string> origin_name_;
  size_t origins_started_ = 0;
  TextCorpusStats stats_;
  bool stopping_ = false;
  std::atomic<bool> failed_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

TextCorpusBuilder::TextCorpusBuilder(const Tokenizer& tokenizer, RowFormat format,
                                     std::string store_dir, bool skip_bad_rows, int threads)
    : impl_(std::make_unique<Impl>(tokenizer, std::move(format), std::move(store_dir),
                                   skip_bad_rows, threads)) {}
TextCorpusBuilder::~TextCorpusBuilder() = default;

void TextCorpusBuilder::add_jsonl(const std::string& path, const std::string& origin) {
  impl_->add_jsonl(path, origin);
}
void TextCorpusBuilder::add_arrow(ArrowArray* array, ArrowSchema* schema, const std::string& origin,
                                  uint64_t first_row) {
  impl_->add_arrow(array, schema, origin, first_row);
}
std::shared_ptr<TextCorpus> TextCorpusBuilder::finish() { return impl_->finish(); }

}  // namespace stoker::text
