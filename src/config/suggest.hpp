// "Did you mean": the closest known name to a misspelt key. Internal to the config reader.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zero3::config_detail {

// Levenshtein distance, ignoring ASCII case.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `name` when it is close enough to be a likely typo (distance at most a third of
// the name's length, at least 2, or 1 for names of up to 4 characters; or one contains the other), else "".
// A name longer than kMaxSuggestedName is no typo of a key: "" without comparing.
inline constexpr size_t kMaxSuggestedName = 100;
std::string closest_name(std::string_view name, const std::vector<std::string_view>& candidates);

}  // namespace zero3::config_detail
