// gloo's rendezvous store, served by zero3's Store: Gloo's ranks exchange their addresses through the same
// TCP store as everything else, under a prefix of their own.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>

#include "zero3/store.hpp"

namespace zero3::comm {

class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<zero3::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<zero3::Store> store_;
};

}  // namespace zero3::comm
