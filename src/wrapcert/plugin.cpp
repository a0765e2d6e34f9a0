#include <wrapcert/error.h>
#include <wrapcert/plugin.h>

#include <dlfcn.h>

#include <exception>

namespace wrapcert {

std::vector<std::string> load_plugin(const std::string& path, Registry& registry) {
  auto refuse = [&path](const std::string& what) {
    return Error(ErrorCode::kInvalidArgument, path, "cannot use the plugin: " + what);
  };
  // A bare name would be looked up on the library path; a plugin is named by its file.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* library = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) throw refuse(::dlerror());
  using Entry = void (*)(Registry&);
  auto* entry = reinterpret_cast<Entry>(::dlsym(library, WRAPCERT_PLUGIN_ENTRY));
  if (!entry) {
    throw refuse("it has no entry point " WRAPCERT_PLUGIN_ENTRY
                 " (define it with WRAPCERT_PLUGIN)");
  }
  // The kinds go into a copy first: a plugin that fails leaves the registry as it was.
  Registry staged = registry;
  const size_t before = staged.kinds().size();
  try {
    entry(staged);
  } catch (const Error&) {
    throw;  // a clash names the kind
  } catch (const std::exception& e) {
    throw refuse(std::string("its entry point threw: ") + e.what());
  }
  std::vector<std::string> added;
  for (size_t i = before; i < staged.kinds().size(); ++i) added.push_back(staged.kinds()[i].name);
  if (added.empty()) throw refuse("it registered no wrapper kind");
  registry = std::move(staged);
  return added;  // the library stays loaded: its kinds' code lives in it
}

}  // namespace wrapcert
