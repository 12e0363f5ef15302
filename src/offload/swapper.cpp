#include "offload/swapper.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::offload {
namespace {

using Clock = std::chrono::steady_clock;
using io::align_up;
using io::kDirectIoAlignment;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string describe(const SwapFile& f, size_t i, const SwapTile& t) {
  return "tile " + std::to_string(i) + " (offset " + std::to_string(t.offset) + ", " + std::to_string(t.bytes) +
         " bytes) of " + f.path();
}

}  // namespace

std::vector<SwapTile> pack_swap_tiles(std::span<const size_t> tile_bytes, uint64_t base) {
  if (base % kDirectIoAlignment != 0) {
    throw InvalidArgument("pack_swap_tiles: base offset " + std::to_string(base) + " is not a multiple of 4096");
  }
  std::vector<SwapTile> tiles;
  tiles.reserve(tile_bytes.size());
  for (size_t b : tile_bytes) {
    tiles.push_back({base, b});
    base += align_up(b, kDirectIoAlignment);
  }
  return tiles;
}

uint64_t swap_tiles_end(std::span<const SwapTile> tiles) {
  uint64_t end = 0;
  for (const auto& t : tiles) end = std::max<uint64_t>(end, t.offset + align_up(t.bytes, kDirectIoAlignment));
  return end;
}

Swapper::Swapper(io::AioEngine& engine, const SwapFile& file, std::vector<SwapTile> tiles, SwapperOptions options)
    : engine_(engine), file_(file), tiles_(std::move(tiles)), trusted_(tiles_.size(), false), options_(options) {
  size_t largest = 0;
  for (size_t i = 0; i < tiles_.size(); ++i) {
    const SwapTile& t = tiles_[i];
    if (t.offset % kDirectIoAlignment != 0) {
      throw InvalidArgument("Swapper: " + describe(file_, i, t) +
                            " starts at an offset that is not a multiple of 4096");
    }
    if (t.offset + align_up(t.bytes, kDirectIoAlignment) > file_.size()) {
      throw InvalidArgument("Swapper: " + describe(file_, i, t) + " ends beyond the swap file's " +
                            std::to_string(file_.size()) + " bytes");
    }
    largest = std::max(largest, t.bytes);
  }
  std::vector<size_t> by_offset(tiles_.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return tiles_[a].offset < tiles_[b].offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const SwapTile& prev = tiles_[by_offset[k - 1]];
    if (prev.offset + align_up(prev.bytes, kDirectIoAlignment) > tiles_[by_offset[k]].offset) {
      throw InvalidArgument("Swapper: " + describe(file_, by_offset[k - 1], prev) + " overlaps " +
                            describe(file_, by_offset[k], tiles_[by_offset[k]]));
    }
  }
  size_t need = 1 + (options_.pipeline_read ? 1 : 0) + (options_.pipeline_write ? 1 : 0);
  if (options_.buffer_count < need) {
    throw ConfigError(options_.config_key + ".buffer_count: " + std::to_string(options_.buffer_count) +
                      " buffers are too few; with pipeline_read=" + (options_.pipeline_read ? "true" : "false") +
                      " and pipeline_write=" + (options_.pipeline_write ? "true" : "false") + " at least " +
                      std::to_string(need) + " are needed (one computed on" +
                      (options_.pipeline_read ? ", one being read ahead" : "") +
                      (options_.pipeline_write ? ", one being written back" : "") + ")");
  }
  size_t padded = align_up(largest, kDirectIoAlignment);
  buffer_bytes_ = options_.buffer_bytes == 0 ? padded : options_.buffer_bytes;
  if (buffer_bytes_ < padded) {
    throw ConfigError(options_.config_key + ".buffer_size: a staging buffer of " + std::to_string(buffer_bytes_) +
                      " bytes cannot hold the largest tile of " + std::to_string(largest) + " bytes (" +
                      std::to_string(padded) + " with O_DIRECT padding)");
  }
  buffer_bytes_ = align_up(buffer_bytes_, kDirectIoAlignment);
  slots_.resize(options_.buffer_count);
  for (auto& s : slots_) s.buffer = io::AlignedBuffer(std::max<size_t>(buffer_bytes_, kDirectIoAlignment));
}

Swapper::~Swapper() { settle_all(); }

void Swapper::wait_timed(const io::IoTicket& ticket) {
  auto t0 = Clock::now();
  try {
    engine_.wait(ticket);
  } catch (...) {
    stats_.io_wait_seconds += since(t0);
    throw;
  }
  stats_.io_wait_seconds += since(t0);
}

// Completes a write in flight: the tile is trusted again only if it succeeded.
void Swapper::finish_write(Slot& slot) {
  Slot::State was = slot.state;
  slot.state = Slot::State::free;
  io::IoTicket t = std::move(slot.ticket);
  slot.ticket = {};
  if (was != Slot::State::writing) return;
  wait_timed(t);  // throws the write's IoError, leaving the tile untrusted
  trusted_[slot.tile] = true;
}

// A free buffer, waiting for the oldest write back if none is free.
Swapper::Slot* Swapper::acquire_slot() {
  for (auto& s : slots_) {
    if (s.state == Slot::State::free) return &s;
  }
  Slot* oldest = nullptr;
  for (auto& s : slots_) {
    if (s.state == Slot::State::writing && (oldest == nullptr || s.write_seq < oldest->write_seq)) oldest = &s;
  }
  if (oldest == nullptr) {
    // Every buffer is being read ahead: the look-ahead is sized so that this cannot happen.
    throw InvalidArgument("Swapper: no staging buffer can be freed (" + std::to_string(slots_.size()) +
                          " buffers, all being read)");
  }
  finish_write(*oldest);
  return oldest;
}

// After an error: waits for everything in flight so no buffer is reused while the kernel owns it.
void Swapper::settle_all() noexcept {
  for (auto& s : slots_) {
    if (s.state == Slot::State::free) continue;
    try {
      if (s.state == Slot::State::writing) {
        finish_write(s);
      } else if (s.ticket.valid()) {
        engine_.wait(s.ticket);
      }
    } catch (const std::exception& e) {
      log::debug("swapper: I/O in flight while unwinding also failed: ", e.what());
    }
    s.state = Slot::State::free;
    s.ticket = {};
  }
}

void Swapper::run(SwapPass pass, const SwapCompute& compute) {
  std::vector<size_t> order(tiles_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  run(pass, order, compute);
}

void Swapper::run(SwapPass pass, std::span<const size_t> order, const SwapCompute& compute) {
  const bool reads = pass != SwapPass::write_only;
  const bool writes = pass != SwapPass::read_only;
  {
    std::vector<bool> seen(tiles_.size(), false);
    for (size_t t : order) {
      if (t >= tiles_.size()) {
        throw InvalidArgument("Swapper::run: tile " + std::to_string(t) + " out of range (" +
                              std::to_string(tiles_.size()) + " tiles in " + file_.path() + ")");
      }
      if (seen[t]) throw InvalidArgument("Swapper::run: tile " + std::to_string(t) + " appears twice in one pass");
      seen[t] = true;
      if (reads && !trusted_[t]) {
        throw IoError("swap " + describe(file_, t, tiles_[t]) +
                      " holds no complete data: it was never written, or its last write failed or did not finish");
      }
    }
  }
  // Reads issued ahead of the tile being computed.
  const size_t lookahead =
      reads && options_.pipeline_read ? slots_.size() - 1 - (writes && options_.pipeline_write ? 1 : 0) : 0;
  std::deque<Slot*> read_queue;  // slots of positions [k, next_read)
  size_t next_read = 0;
  try {
    for (size_t k = 0; k < order.size(); ++k) {
      Slot* slot = nullptr;
      if (reads) {
        while (next_read < order.size() && next_read <= k + lookahead) {
          size_t t = order[next_read];
          Slot* s = acquire_slot();
          s->state = Slot::State::reading;
          s->tile = t;
          s->ticket = engine_.submit_read(file_.file(), s->buffer.data(), align_up(tiles_[t].bytes, kDirectIoAlignment),
                                          tiles_[t].offset);
          stats_.bytes_read += align_up(tiles_[t].bytes, kDirectIoAlignment);
          if (next_read > k) ++stats_.reads_ahead;
          read_queue.push_back(s);
          ++next_read;
        }
        slot = read_queue.front();
        read_queue.pop_front();
        wait_timed(slot->ticket);
        slot->ticket = {};
      } else {
        slot = acquire_slot();
        slot->tile = order[k];
      }
      const size_t t = order[k];
      const SwapTile& tile = tiles_[t];
      // Computing: the buffer is owned by this iteration (not free, no I/O on it).
      slot->state = Slot::State::reading;
      auto c0 = Clock::now();
      compute(t, std::span<std::byte>(slot->buffer.data(), tile.bytes));
      stats_.compute_seconds += since(c0);
      if (!writes) {
        slot->state = Slot::State::free;
        continue;
      }
      size_t padded = align_up(tile.bytes, kDirectIoAlignment);
      std::memset(slot->buffer.data() + tile.bytes, 0, padded - tile.bytes);
      trusted_[t] = false;
      slot->state = Slot::State::writing;
      slot->write_seq = ++write_seq_;
      slot->ticket = engine_.submit_write(file_.file(), slot->buffer.data(), padded, tile.offset);
      stats_.bytes_written += padded;
      if (!options_.pipeline_write) finish_write(*slot);
    }
    // The pass ends with every write on disk, so the next pass (or a read_tile) sees it.
    for (auto& s : slots_) {
      if (s.state == Slot::State::writing) finish_write(s);
    }
  } catch (...) {
    settle_all();
    throw;
  }
}

void Swapper::write_tile(size_t t, std::span<const std::byte> data) {
  if (t >= tiles_.size()) throw InvalidArgument("Swapper::write_tile: tile " + std::to_string(t) + " out of range");
  if (data.size() != tiles_[t].bytes) {
    throw InvalidArgument("Swapper::write_tile: " + std::to_string(data.size()) + " bytes given for " +
                          describe(file_, t, tiles_[t]));
  }
  size_t one[] = {t};
  run(SwapPass::write_only, one,
      [&](size_t, std::span<std::byte> buf) { std::memcpy(buf.data(), data.data(), data.size()); });
}

void Swapper::read_tile(size_t t, std::span<std::byte> data) {
  if (t >= tiles_.size()) throw InvalidArgument("Swapper::read_tile: tile " + std::to_string(t) + " out of range");
  if (data.size() != tiles_[t].bytes) {
    throw InvalidArgument("Swapper::read_tile: " + std::to_string(data.size()) + " bytes given for " +
                          describe(file_, t, tiles_[t]));
  }
  size_t one[] = {t};
  run(SwapPass::read_only, one,
      [&](size_t, std::span<std::byte> buf) { std::memcpy(data.data(), buf.data(), buf.size()); });
}

}  // namespace zero3::offload
