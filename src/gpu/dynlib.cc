#include "dynlib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>

namespace stoker::image::gpu::internal {
namespace {

std::string basename_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool has_prefix(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (name.compare(0, p.size(), p) == 0) return true;
  return false;
}

struct LoadedSearch {
  const std::vector<std::string>* prefixes;
  std::vector<std::string> found;
};

int collect_loaded(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<LoadedSearch*>(data);
  if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
    const std::string path = info->dlpi_name;
    if (has_prefix(basename_of(path), *s->prefixes)) s->found.push_back(path);
  }
  return 0;
}

void note(std::string* tried, const std::string& what, const std::string& why) {
  if (tried != nullptr) *tried += "\n  " + what + ": " + why;
}

void* try_open(const std::string& what, int flags, std::string* tried) {
  void* h = dlopen(what.c_str(), flags);
  if (h == nullptr) {
    const char* e = dlerror();
    note(tried, what, e != nullptr ? e : "not found");
  }
  return h;
}

// `h` when it exports `symbol`; otherwise closes it (this search's reference only: a library the
// process had loaded stays loaded) and says why in `tried`.
void* with_symbol(void* h, const std::string& what, const char* symbol, std::string* tried) {
  if (h == nullptr) return nullptr;
  dlerror();
  if (dlsym(h, symbol) != nullptr) return h;
  dlclose(h);
  note(tried, what, std::string("skipped: lacks ") + symbol);
  return nullptr;
}

// The names in `dir` that start with one of `prefixes` and contain ".so", the highest first.
std::vector<std::string> matching_files(const std::string& dir,
                                        const std::vector<std::string>& prefixes) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (has_prefix(name, prefixes) && name.find(".so") != std::string::npos)
        names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.rbegin(), names.rend());  // the highest version first
  return names;
}

}  // namespace

void* open_library(const std::vector<std::string>& prefixes,
                   const std::vector<std::string>& sonames, const std::vector<std::string>& dirs,
                   const char* symbol, std::string* tried) {
  LoadedSearch loaded{&prefixes, {}};
  dl_iterate_phdr(collect_loaded, &loaded);
  for (const std::string& path : loaded.found)
    if (void* h = with_symbol(dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD), path + " (loaded)",
                              symbol, tried))
      return h;
  for (const std::string& dir : dirs) {
    for (const std::string& so : sonames) {
      const std::string path = dir + "/" + so;
      if (void* h = with_symbol(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL), path, symbol, tried))
        return h;
    }
    for (const std::string& name : matching_files(dir, prefixes)) {
      const std::string path = dir + "/" + name;
      if (void* h = with_symbol(try_open(path, RTLD_NOW | RTLD_LOCAL, tried), path, symbol, tried))
        return h;
    }
    note(tried, dir, "no " + sonames.front() + " with " + symbol + " there");
  }
  for (const std::string& so : sonames)
    if (void* h = with_symbol(try_open(so, RTLD_NOW | RTLD_LOCAL, tried), so, symbol, tried))
      return h;
  return nullptr;
}

std::vector<std::string> load_companions(const std::string& library_file,
                                         const std::vector<std::string>& prefixes,
                                         std::string* tried) {
  std::vector<std::string> loaded;
  const size_t slash = library_file.rfind('/');
  if (slash == std::string::npos) return loaded;
  const std::string dir = library_file.substr(0, slash);
  for (const std::string& name : matching_files(dir, prefixes)) {
    const std::string path = dir + "/" + name;
    // Never closed: the library that needs it may open it at any time.
    if (try_open(path, RTLD_NOW | RTLD_LOCAL, tried) != nullptr) loaded.push_back(path);
  }
  return loaded;
}

std::string library_path(void* handle) {
  link_map* map = nullptr;
  if (handle == nullptr || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return "";
  return map->l_name != nullptr ? map->l_name : "";
}

}  // namespace stoker::image::gpu::internal
