// Internal: finding a shared library at run time (libnvjpeg, libnvrtc), so that the build and the
// CPU-only install never depend on CUDA.
#pragma once

#include <string>
#include <vector>

namespace stoker::image::gpu::internal {

// Opens the first of, in order, that exports `symbol` (the library's API: a file matched by
// prefix may be another library of the same family, libnvjpeg2k for "libnvjpeg",
// libnvrtc-builtins for "libnvrtc-"):
// 1. a library already loaded in the process whose file name starts with one of `prefixes`
//    (torchvision or torch may have loaded nvJPEG or NVRTC already: use that copy, not a second);
// 2. in each directory of `dirs`: each of `sonames`, then any file whose name starts with a prefix
//    and contains ".so" (wheels rename bundled libraries: libnvjpeg.<hash>.so.12), the highest
//    name first;
// 3. each of `sonames` through the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache).
// A candidate without `symbol` is skipped (the handle this search opened for it is closed again)
// and the search goes on. Returns the dlopen handle, or nullptr; `tried` (when not null) then
// lists every attempt and why it failed (dlerror(), or the missing symbol), for the error message.
void* open_library(const std::vector<std::string>& prefixes,
                   const std::vector<std::string>& sonames, const std::vector<std::string>& dirs,
                   const char* symbol, std::string* tried);

// The file a handle from open_library was loaded from (empty if unknown).
std::string library_path(void* handle);

// Loads, for the life of the process, every file in the directory of `library_file` whose name
// starts with one of `prefixes` and contains ".so". For libraries that dlopen a companion by bare
// name: NVRTC opens libnvrtc-builtins.so.<major>.<minor> that way, which the dynamic loader does
// not find in a wheel's directory (nvidia/cu13/lib is on no search path) unless a library of that
// soname is already loaded. Returns the files loaded; failures are appended to `tried`.
std::vector<std::string> load_companions(const std::string& library_file,
                                         const std::vector<std::string>& prefixes,
                                         std::string* tried);

}  // namespace stoker::image::gpu::internal
