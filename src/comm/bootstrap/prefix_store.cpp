#include <memory>

#include "zero3/error.hpp"
#include "zero3/store.hpp"

namespace zero3 {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix) + "/") {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { base_->set(prefix_ + key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return base_->get(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(prefix_ + key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(prefixed(keys), timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string& prefix) {
  if (!base) throw InvalidArgument("make_prefix_store: base store is null (prefix '" + prefix + "')");
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace zero3
