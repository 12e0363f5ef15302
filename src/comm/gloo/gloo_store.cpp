#include "comm/gloo/gloo_store.hpp"

namespace zero3::comm {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  auto v = store_->get(key);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { store_->wait(keys, store_->timeout()); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // gloo passes its context timeout; never wait longer than our store allows either.
  store_->wait(keys, timeout.count() > 0 ? std::min(timeout, store_->timeout()) : store_->timeout());
}

}  // namespace zero3::comm
