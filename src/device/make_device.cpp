#include <algorithm>
#include <map>
#include <mutex>

#include "device/device_registry.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace detail {
namespace {

struct Entry {
  DeviceFactory factory;
  DeviceUsable usable;
  DeviceActivate activate;
};

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> table;
  return table;
}

}  // namespace

void register_device(const std::string& kind, DeviceFactory factory, DeviceUsable usable, DeviceActivate activate) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[kind] = Entry{std::move(factory), std::move(usable), std::move(activate)};
}

std::string resolve_device_kind(const std::string& kind) {
  if (kind != "auto") return kind;
  DeviceUsable usable;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto cuda = registry().find("cuda");
    if (cuda == registry().end()) return "cpu";
    usable = cuda->second.usable;
  }
  return !usable || usable() ? "cuda" : "cpu";
}

void activate_device(const std::string& kind, int index) {
  DeviceActivate activate;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(kind);
    if (it != registry().end()) activate = it->second.activate;
  }
  if (activate) activate(index);
}

std::vector<std::string> registered_devices() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, entry] : registry()) names.push_back(name);
  return names;
}

}  // namespace detail

std::unique_ptr<Device> make_device(const std::string& name) { return make_device(name, nullptr); }

std::unique_ptr<Device> make_device(const std::string& name, Stream compute_stream) {
  std::string kind = name;
  int index = 0;
  if (auto colon = name.find(':'); colon != std::string::npos) {
    kind = name.substr(0, colon);
    std::string digits = name.substr(colon + 1);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        digits.size() > 6) {
      throw InvalidArgument("make_device: \"" + name + "\" is not a device name (cpu, cuda, cuda:N or auto)");
    }
    index = std::stoi(digits);
  }
  kind = detail::resolve_device_kind(kind);
  detail::DeviceFactory factory;
  {
    std::lock_guard<std::mutex> lock(detail::registry_mutex());
    auto& table = detail::registry();
    auto it = table.find(kind);
    if (it == table.end()) {
      if (kind == "cuda")
        throw Unsupported("make_device: this build of zero3 has no CUDA device support (\"" + name + "\")");
      throw InvalidArgument("make_device: unknown device \"" + name + "\" (cpu, cuda, cuda:N or auto)");
    }
    factory = it->second.factory;
  }
  return factory(index, compute_stream);
}

}  // namespace zero3
