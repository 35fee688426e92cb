// Internal to the device layer: vendor libraries loaded at run time (cuBLASLt,
// NCCL, NVML), so a binary starts where they are missing and only the paths
// that need them fail, naming the library.
#pragma once

#include <dlfcn.h>

#include <string>

namespace anvil::device {

// dlopen(name); null with `error` set ("cannot load NAME: ...") when it fails.
inline void* open_library(const char* name, std::string& error) {
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    error = std::string("cannot load ") + name + ": " + (e ? e : "not found");
  }
  return lib;
}

// Binds `symbol` of `lib` to `f` (its pointer type: decltype(&symbol));
// the first missing symbol sets `error`.
template <class F>
void bind_symbol(void* lib, const char* lib_name, const char* symbol, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!f && error.empty()) error = std::string(lib_name) + " has no " + symbol;
}

}  // namespace anvil::device
