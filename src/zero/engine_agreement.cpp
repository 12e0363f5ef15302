// Schedule agreement. Every scope entry and exit is an event; each micro-step (evaluation batch) keeps its
// events and their running hash, and step() (EvalMode::next_batch()) compares the hash across ranks before it
// does anything else, so the optimizer never applies gradients reduced in another rank's order. A collective
// that already differs in the middle of the micro-step (another unit's all-gather) is caught by the
// communicator (Gloo) or the CollectiveGuard (nccl) before it moves data. Either way the ranks then exchange
// their events, and the error names the first one that differs. During the first micro-step, and every one
// with zero3.check_schedule_every_step, each entry is also compared before anything is issued for it.
#include <algorithm>
#include <chrono>
#include <map>

#include "zero/collective_guard.hpp"
#include "zero/engine_impl.hpp"
#include "zero/rank_agreement.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

bool EngineImpl::checking_order() const {
  const int64_t done = evaluating_ ? eval_batches_ : local_micro_steps_;
  return world_ > 1 && (done == 0 || config_.zero3.check_schedule_every_step);
}

void EngineImpl::record_event(int64_t code) {
  events_.push_back(code);
  events_hash_ = fnv1a(&code, sizeof code, events_hash_);
}

void EngineImpl::reset_events() {
  events_.clear();
  events_hash_ = fnv1a("zero3-schedule", 14);
}

int64_t EngineImpl::event_code(UnitId unit, Phase phase, bool closing) const {
  return 1 + 4 * static_cast<int64_t>(unit.index) + (closing ? 2 : 0) + (phase == Phase::backward ? 1 : 0);
}

int64_t EngineImpl::step_code() const { return 1 + 4 * static_cast<int64_t>(units_.size()); }

std::string EngineImpl::describe_code(int64_t code) const {
  if (code < 0) return "had no more events";
  if (code == step_code()) return "called step()";
  const int64_t u = (code - 1) / 4;
  const int64_t kind = (code - 1) % 4;
  const std::string name =
      u >= 0 && static_cast<size_t>(u) < units_.size() ? units_[static_cast<size_t>(u)].info.name : "?";
  const char* scope = kind % 2 == 1 ? "backward_scope" : "forward_scope";
  return log::concat(kind >= 2 ? "closed " : "called ", scope, "('", name, "')");
}

std::string EngineImpl::schedule_position() const {
  return evaluating_ ? log::concat("evaluation batch ", eval_batches_, " (after optimizer step ", global_steps_, ")")
                     : log::concat("micro-step ", micro_steps_, " (optimizer step ", global_steps_, ")");
}

std::string EngineImpl::divergence_message(const std::vector<std::vector<int64_t>>& all,
                                           const std::string& where) const {
  size_t longest = 0;
  for (const auto& h : all) longest = std::max(longest, h.size());
  for (size_t i = 0; i < longest; ++i) {
    std::map<int64_t, std::vector<int>> groups;
    for (int r = 0; r < world_; ++r) {
      const auto& h = all[static_cast<size_t>(r)];
      groups[i < h.size() ? h[i] : -1].push_back(r);
    }
    if (groups.size() == 1) continue;
    std::string detail;
    for (const auto& [c, ranks] : groups) {
      detail += log::concat(detail.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks), " ",
                            describe_code(c));
    }
    return log::concat("the ranks entered units in different orders at scope event ", i, " of ",
                       where.empty() ? schedule_position() : where, ": ", detail,
                       ". Every rank must open and close the same unit scopes in the same order (the collectives of "
                       "ZeRO depend on it); this is rank ",
                       rank_, ".");
  }
  return "";
}

bool EngineImpl::ranks_hold(const std::vector<float>& mine, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const bool same = ranks_agree(*queue_, *comm_, mine, what, &device_);
  stats_.agreement_checks++;
  stats_.agreement_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return same;
}

void EngineImpl::check_order(int64_t code, const std::string& doing) {
  std::vector<float> mine{static_cast<float>(code)};
  if (ranks_hold(mine, "schedule check before " + doing + " in " + schedule_position())) return;
  std::vector<int64_t> history = events_;
  history.push_back(code);
  auto all = gather_from_ranks(*queue_, *comm_, history,
                               "schedule check: exchanging the events of " + schedule_position(), &device_);
  std::string message = divergence_message(all);
  if (message.empty()) message = log::concat("the ranks disagree on the order of units in ", schedule_position());
  throw CommError(message);
}

void EngineImpl::verify_schedule(const std::string& doing) {
  if (world_ == 1) return;
  std::vector<float> mine = hash_to_floats(events_hash_);
  mine.push_back(static_cast<float>(events_.size() % (kMaxExactFloatInt / 2)));
  const std::string where = schedule_position();
  if (ranks_hold(mine, "schedule agreement at " + doing + " in " + where)) return;
  auto all =
      gather_from_ranks(*queue_, *comm_, events_, "schedule agreement: exchanging the events of " + where, &device_);
  std::string message = divergence_message(all);
  if (message.empty()) {
    message = log::concat("the ranks' scope events of ", where, " hash differently (rank ", rank_, ")");
  }
  throw CommError(message);
}

std::exception_ptr EngineImpl::explain_mismatch(std::exception_ptr error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveMismatchError& mismatch) {
    // Every rank found the difference at the same collective and issued nothing after it (the queue is
    // poisoned), so the communicator is in step for one more exchange, run here outside the queue.
    try {
      CommQueue exchange(false);
      auto all = gather_from_ranks(exchange, *comm_, events_,
                                   "schedule agreement: exchanging the events of " + schedule_position(), &device_);
      std::string message = divergence_message(all);
      if (!message.empty()) {
        return std::make_exception_ptr(
            CommError(log::concat(message, " (Found when the ranks' collectives differed: ", mismatch.what(), ")")));
      }
    } catch (const std::exception& e) {
      log::warn("after the ranks' collectives differed, exchanging their scope events failed: ", e.what());
    }
    return error;
  } catch (...) {
    return error;
  }
}

void EngineImpl::guard_calls(bool checking) {
  if (guard_ != nullptr) guard_->set_checking(checking);
}

void EngineImpl::defer_schedule_check() {
  window_events_.push_back(events_);
  window_positions_.push_back(schedule_position());
  window_hash_ = fnv1a(&events_hash_, sizeof events_hash_, window_hash_);
  window_event_count_ += static_cast<int64_t>(events_.size());
}

}  // namespace zero3::detail
