#include "zero/param_prefetcher.hpp"

#include <algorithm>
#include <chrono>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

ParamPrefetcher::ParamPrefetcher(ParamSwap& swap, size_t buffer_count)
    : swap_(swap), buffer_bytes_(swap.largest_padded_bytes()), slot_of_(swap.units(), -1) {
  if (buffer_count == 0) throw InvalidArgument("ParamPrefetcher: no read buffers (buffer_count is 0)");
  slots_.resize(buffer_count);
  for (Slot& s : slots_) s.buffer = io::AlignedBuffer(std::max(buffer_bytes_, io::kDirectIoAlignment));
}

ParamPrefetcher::~ParamPrefetcher() {
  for (Slot& s : slots_) settle(s);
}

void ParamPrefetcher::settle(Slot& slot) noexcept {
  if (!slot.ticket.valid()) return;
  try {
    swap_.wait(slot.ticket);
  } catch (const std::exception& e) {
    log::debug("parameter read of unit #", slot.unit, " dropped; it had failed: ", e.what());
  }
  slot.ticket = {};
}

ParamPrefetcher::Slot& ParamPrefetcher::take_slot() {
  for (Slot& s : slots_) {
    if (s.state == Slot::State::free) return s;
  }
  // No free buffer: the one read furthest ahead (started last) gives way to the unit needed now.
  Slot* furthest = nullptr;
  for (Slot& s : slots_) {
    if (s.state == Slot::State::reading && (furthest == nullptr || s.seq > furthest->seq)) furthest = &s;
  }
  if (furthest == nullptr) {
    throw InvalidArgument(log::concat("ParamPrefetcher: every one of the ", slots_.size(),
                                      " read buffers feeds an all-gather in flight; release one first"));
  }
  settle(*furthest);
  slot_of_[furthest->unit] = -1;
  furthest->state = Slot::State::free;
  furthest->error = nullptr;
  return *furthest;
}

void ParamPrefetcher::begin_read(Slot& slot, size_t unit) {
  slot.state = Slot::State::reading;
  slot.unit = unit;
  slot.seq = ++seq_;
  slot.error = nullptr;
  slot.ticket = {};
  slot_of_[unit] = static_cast<int>(&slot - slots_.data());
  try {
    slot.ticket = swap_.start_read(unit, slot.buffer.data());
  } catch (...) {
    slot.error = std::current_exception();  // thrown by the claim that needs it
  }
}

bool ParamPrefetcher::start(size_t unit) {
  if (holds(unit)) return true;
  for (Slot& s : slots_) {
    if (s.state == Slot::State::free) {
      begin_read(s, unit);
      return true;
    }
  }
  return false;
}

ParamPrefetcher::Claim ParamPrefetcher::claim(size_t unit) {
  Claim c;
  c.read_ahead = holds(unit);
  Slot* slot = nullptr;
  if (c.read_ahead) {
    slot = &slots_[static_cast<size_t>(slot_of_[unit])];
    if (slot->state == Slot::State::claimed) {
      throw InvalidArgument(log::concat("ParamPrefetcher: the slice of unit #", unit, " is already claimed"));
    }
  } else {
    slot = &take_slot();
    begin_read(*slot, unit);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (slot->error) std::rethrow_exception(slot->error);
    swap_.wait(slot->ticket);
  } catch (...) {
    // The request is complete (or never started): the buffer can be read into again.
    slot->ticket = {};
    slot->error = nullptr;
    slot->state = Slot::State::free;
    slot_of_[unit] = -1;
    throw;
  }
  c.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  slot->ticket = {};
  slot->state = Slot::State::claimed;
  slot->seq = ++seq_;
  c.data = slot->buffer.data();
  return c;
}

void ParamPrefetcher::release(size_t unit) {
  if (!claimed(unit)) {
    throw InvalidArgument(log::concat("ParamPrefetcher::release: the slice of unit #", unit, " is not claimed"));
  }
  Slot& s = slots_[static_cast<size_t>(slot_of_[unit])];
  s.state = Slot::State::free;
  slot_of_[unit] = -1;
}

void ParamPrefetcher::discard(size_t unit) {
  if (!holds(unit)) return;
  Slot& s = slots_[static_cast<size_t>(slot_of_[unit])];
  if (s.state == Slot::State::claimed) {
    throw InvalidArgument(
        log::concat("ParamPrefetcher::discard: the slice of unit #", unit, " still feeds an all-gather"));
  }
  settle(s);
  s.error = nullptr;
  s.state = Slot::State::free;
  slot_of_[unit] = -1;
}

bool ParamPrefetcher::claimed(size_t unit) const {
  return holds(unit) && slots_[static_cast<size_t>(slot_of_[unit])].state == Slot::State::claimed;
}

bool ParamPrefetcher::can_claim(size_t unit) const {
  if (holds(unit)) return true;
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state != Slot::State::claimed; });
}

size_t ParamPrefetcher::free_buffers() const {
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state == Slot::State::free; }));
}

std::vector<size_t> ParamPrefetcher::units_in(Slot::State state) const {
  std::vector<const Slot*> in;
  for (const Slot& s : slots_) {
    if (s.state == state) in.push_back(&s);
  }
  std::sort(in.begin(), in.end(), [](const Slot* a, const Slot* b) { return a->seq < b->seq; });
  std::vector<size_t> units;
  for (const Slot* s : in) units.push_back(s->unit);
  return units;
}

std::vector<size_t> ParamPrefetcher::claimed_units() const { return units_in(Slot::State::claimed); }

std::vector<size_t> ParamPrefetcher::reading_units() const { return units_in(Slot::State::reading); }

bool ParamPrefetcher::read_done(size_t unit) const {
  if (!holds(unit)) return false;
  const Slot& s = slots_[static_cast<size_t>(slot_of_[unit])];
  return s.state == Slot::State::reading && (s.error || !s.ticket.valid() || swap_.ready(s.ticket));
}

}  // namespace zero3::detail
