#include "stoker/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include "stoker/errors.h"

namespace stoker {
namespace {

// The guard of the copy running on this thread, if any. Set only around a guarded copy, so the
// handler never sees a stale one.
thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_guard) {
    t_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  // Not a guarded copy: what would have happened without us.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: returning re-runs the faulting access, which then kills the process.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    // SA_NODEFER: a siglongjmp out of the handler leaves SIGBUS unblocked (the jump does not
    // restore the mask, which keeps the guard cheap). No SA_ONSTACK: the faulting thread's own
    // stack is fine for a failed load, and a jump off an alternate stack costs AddressSanitizer
    // a read of /proc/self/maps per signal.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

MappedFile::MappedFile(std::string path, const std::string& what)
    : path_(std::move(path)), what_(what) {
  // O_NONBLOCK: a FIFO fails the regular-file check below instead of blocking in open().
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw IoError("cannot open " + what_ + " " + path_ + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("cannot stat " + what_ + " " + path_ + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("cannot map " + what_ + " " + path_ + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED)
    throw IoError("cannot map " + what_ + " " + path_ + ": " + std::strerror(err));
  data_ = static_cast<const std::byte*>(map);
  install_handler();
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::copy(void (*fn)(void*), void* arg) const {
  sigjmp_buf jmp;
  if (sigsetjmp(jmp, 0) != 0) {
    // A handler run through a wrapper (ThreadSanitizer's) may have had SIGBUS blocked despite
    // SA_NODEFER; the jump out of it would leave it blocked, and the next SIGBUS on this thread
    // would then kill the process. One syscall, on the error path only.
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    throw IoError(what_ + " " + path_ + " was truncated while being read (it had " +
                  std::to_string(size_) + " bytes when it was opened)");
  }
  t_guard = &jmp;
  fn(arg);
  t_guard = nullptr;
}

}  // namespace stoker
