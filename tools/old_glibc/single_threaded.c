// See sys/single_threaded.h. Hidden: each extension module has its own, read only by the
// libstdc++ linked into that module.
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
