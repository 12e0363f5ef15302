// to_json(): the config as DeepSpeed-shaped JSON, written from the key table's emitters.
#include <string>

#include "config/key_table.hpp"
#include "zero3/config.hpp"

namespace zero3 {

std::string to_json(const Config& config) {
  using config_detail::KeyEntry;
  using config_detail::KeyStatus;
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  const std::string scheduler_type(config_detail::scheduler_type_name(config.scheduler.type));
  for (const KeyEntry& e : config_detail::key_table()) {
    if (!e.emit || e.status != KeyStatus::supported) continue;
    if (!e.only_for.empty() &&
        (" " + std::string(e.only_for) + " ").find(" " + scheduler_type + " ") == std::string::npos) {
      continue;
    }
    // A precision section the file did not have and nothing enabled stays out: written out as "enabled": false
    // it would say fp32 compute where the file left the precision to the program.
    const std::string_view key = e.path;
    if ((key.starts_with("fp16.") && !config.fp16.section_given && !config.fp16.enabled) ||
        (key.starts_with("bf16.") && !config.bf16.section_given && !config.bf16.enabled)) {
      continue;
    }
    std::optional<nlohmann::ordered_json> value = e.emit(config);
    if (!value) continue;
    // Sections are created on the way down, in table order, only when one of their keys is written.
    nlohmann::ordered_json* node = &root;
    std::string_view path = e.path;
    size_t dot;
    while ((dot = path.find('.')) != std::string_view::npos) {
      std::string part(path.substr(0, dot));
      if (!node->contains(part)) (*node)[part] = nlohmann::ordered_json::object();
      node = &(*node)[part];
      path = path.substr(dot + 1);
    }
    (*node)[std::string(path)] = std::move(*value);
  }
  return root.dump(4) + "\n";
}

}  // namespace zero3
