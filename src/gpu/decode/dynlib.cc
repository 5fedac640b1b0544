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

void* try_open(const std::string& what, int flags, std::string* tried) {
  void* h = dlopen(what.c_str(), flags);
  if (h == nullptr && tried != nullptr) {
    const char* e = dlerror();
    *tried += "\n  " + what + ": " + (e != nullptr ? e : "not found");
  }
  return h;
}

}  // namespace

void* open_library(const std::vector<std::string>& prefixes,
                   const std::vector<std::string>& sonames, const std::vector<std::string>& dirs,
                   std::string* tried) {
  LoadedSearch loaded{&prefixes, {}};
  dl_iterate_phdr(collect_loaded, &loaded);
  for (const std::string& path : loaded.found)
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) return h;
  for (const std::string& dir : dirs) {
    for (const std::string& so : sonames)
      if (void* h = dlopen((dir + "/" + so).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    std::vector<std::string> renamed;
    if (DIR* d = opendir(dir.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (has_prefix(name, prefixes) && name.find(".so") != std::string::npos)
          renamed.push_back(name);
      }
      closedir(d);
    }
    std::sort(renamed.rbegin(), renamed.rend());  // the highest version first
    for (const std::string& name : renamed)
      if (void* h = try_open(dir + "/" + name, RTLD_NOW | RTLD_LOCAL, tried)) return h;
    if (tried != nullptr) *tried += "\n  " + dir + ": no " + sonames.front() + " there";
  }
  for (const std::string& so : sonames)
    if (void* h = try_open(so, RTLD_NOW | RTLD_LOCAL, tried)) return h;
  return nullptr;
}

std::string library_path(void* handle) {
  link_map* map = nullptr;
  if (handle == nullptr || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return "";
  return map->l_name != nullptr ? map->l_name : "";
}

}  // namespace stoker::image::gpu::internal
