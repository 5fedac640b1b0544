// Stoker's exception types.
//
// Every error the engine raises derives from stoker::Error. A failure while producing a sample is
// caught on the worker thread, kept as an exception_ptr and rethrown on the consumer's thread as a
// SampleError that names the sample (index, and path where the source has one) and keeps the
// original exception as its cause. The Python bindings map each type to a Python exception class
// (InvalidArgument -> ValueError, TemplateError -> stoker.errors.TemplateError (a ValueError),
// DecodeError -> stoker.DecodeError, SampleError -> stoker.SampleError, BudgetExceeded ->
// stoker.MemoryBudgetError).
//
// Thread safety: exceptions are immutable after construction, safe to rethrow on another thread
// (which is how a worker's failure reaches the consumer).
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace stoker {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument outside what the API allows; the message says what is allowed.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A chat template's own error: it called raise_exception(message) (stoker/text/chat_template.h).
// what() is the template's message, unchanged, as transformers' jinja2 raises it.
class TemplateError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Input data that cannot be decoded: corrupt, truncated, empty, unsupported format, or larger than
// the configured pixel limit. The message is the decoder's.
class DecodeError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be opened or read.
class IoError : public Error {
 public:
  using Error::Error;
};

// The memory budget cannot hold what was asked for (for example, the consumer keeps every batch).
class BudgetExceeded : public Error {
 public:
  using Error::Error;
};

// The failure of one sample, as the consumer sees it.
class SampleError : public Error {
 public:
  SampleError(uint64_t index, std::string path, std::exception_ptr cause)
      : Error(describe(index, path, cause)),
        index_(index),
        path_(std::move(path)),
        cause_(std::move(cause)) {}

  uint64_t index() const { return index_; }
  const std::string& path() const { return path_; }  // empty when the source has no paths
  const std::exception_ptr& cause() const { return cause_; }

  // The cause's message, or a generic text for non-standard exceptions.
  static std::string message_of(const std::exception_ptr& cause) {
    try {
      if (cause) std::rethrow_exception(cause);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
    }
    return "unknown error";
  }

 private:
  static std::string describe(uint64_t index, const std::string& path,
                              const std::exception_ptr& cause) {
    std::string s = "sample " + std::to_string(index);
    if (!path.empty()) s += " (" + path + ")";
    return s + ": " + message_of(cause);
  }

  uint64_t index_;
  std::string path_;
  std::exception_ptr cause_;
};

}  // namespace stoker
