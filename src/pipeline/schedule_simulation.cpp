#include "pipeline/schedule_simulation.hpp"

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "zero3/error.hpp"

namespace zero3::pipeline::detail {

std::string describe(const Action& a) {
  const std::string at = " micro-batch " + std::to_string(a.micro_batch) + " on stage " + std::to_string(a.stage);
  switch (a.kind) {
    case ActionKind::forward:
      return "forward of" + at;
    case ActionKind::backward:
      return "backward of" + at;
    case ActionKind::send_activation:
      return "send of the activation of" + at + " to rank " + std::to_string(a.peer_rank);
    case ActionKind::recv_activation:
      return "receive of the activation of" + at + " from rank " + std::to_string(a.peer_rank);
    case ActionKind::send_gradient:
      return "send of the gradient of" + at + " to rank " + std::to_string(a.peer_rank);
    case ActionKind::recv_gradient:
      return "receive of the gradient of" + at + " from rank " + std::to_string(a.peer_rank);
  }
  return "unknown action";
}

namespace {

bool is_send(const Action& a) { return a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient; }

// What a transfer's counterpart on the peer must be.
Action counterpart(const Action& a, int rank) {
  Action c;
  switch (a.kind) {
    case ActionKind::send_activation:
      c.kind = ActionKind::recv_activation;
      break;
    case ActionKind::recv_activation:
      c.kind = ActionKind::send_activation;
      break;
    case ActionKind::send_gradient:
      c.kind = ActionKind::recv_gradient;
      break;
    default:
      c.kind = ActionKind::send_gradient;
      break;
  }
  c.micro_batch = a.micro_batch;
  c.stage = a.peer_stage;
  c.peer_stage = a.stage;
  c.peer_rank = rank;
  return c;
}

[[noreturn]] void fail(const Schedule& s, int rank, size_t at, const std::string& why) {
  throw InvalidArgument(std::string(schedule_name(s.kind)) + " schedule, rank " + std::to_string(rank) + ", action " +
                        std::to_string(at) + ": " + why);
}

}  // namespace

Partners check_and_match(const Schedule& s) {
  const int stages = s.stages();
  if (static_cast<int>(s.actions.size()) != s.ranks) {
    throw InvalidArgument(std::string(schedule_name(s.kind)) + " schedule: " + std::to_string(s.actions.size()) +
                          " action lists for " + std::to_string(s.ranks) + " ranks");
  }
  // Per rank: what this rank has done so far, to check each action's prerequisites in its own list.
  std::set<std::tuple<int, int, int>> seen;  // (kind, micro-batch, stage)
  auto has = [&](ActionKind k, int m, int st) { return seen.count({static_cast<int>(k), m, st}) > 0; };
  std::map<std::tuple<int, int, bool>, std::vector<size_t>> transfers;  // (rank, peer, send) -> indices in order
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const int m = a.micro_batch, st = a.stage;
      if (m < 0 || m >= s.micro_batches) fail(s, r, i, describe(a) + ": no such micro-batch");
      if (st < 0 || st >= stages || s.rank_of_stage(st) != r) {
        fail(s, r, i, describe(a) + ": that stage is not on this rank");
      }
      if (has(a.kind, m, st)) fail(s, r, i, describe(a) + " appears twice");
      switch (a.kind) {
        case ActionKind::forward:
          if (st > 0 && s.rank_of_stage(st - 1) != r && !has(ActionKind::recv_activation, m, st)) {
            fail(s, r, i, describe(a) + " comes before its input activation was received");
          }
          if (st > 0 && s.rank_of_stage(st - 1) == r && !has(ActionKind::forward, m, st - 1)) {
            fail(s, r, i, describe(a) + " comes before the forward of stage " + std::to_string(st - 1));
          }
          break;
        case ActionKind::backward:
          if (!has(ActionKind::forward, m, st)) fail(s, r, i, describe(a) + " comes before its forward");
          if (st < stages - 1 && s.rank_of_stage(st + 1) != r && !has(ActionKind::recv_gradient, m, st)) {
            fail(s, r, i, describe(a) + " comes before the gradient of its output was received");
          }
          if (st < stages - 1 && s.rank_of_stage(st + 1) == r && !has(ActionKind::backward, m, st + 1)) {
            fail(s, r, i, describe(a) + " comes before the backward of stage " + std::to_string(st + 1));
          }
          break;
        case ActionKind::send_activation:
        case ActionKind::recv_activation:
        case ActionKind::send_gradient:
        case ActionKind::recv_gradient: {
          const bool activation = a.kind == ActionKind::send_activation || a.kind == ActionKind::recv_activation;
          const int expected_peer_stage = activation == is_send(a) ? st + 1 : st - 1;
          if (a.peer_stage != expected_peer_stage || expected_peer_stage < 0 || expected_peer_stage >= stages ||
              a.peer_rank != s.rank_of_stage(a.peer_stage) || a.peer_rank == r) {
            fail(s, r, i,
                 describe(a) + ": expected the neighbouring stage " + std::to_string(expected_peer_stage) +
                     " on another rank");
          }
          if (a.kind == ActionKind::send_activation && !has(ActionKind::forward, m, st)) {
            fail(s, r, i, describe(a) + " comes before its forward");
          }
          if (a.kind == ActionKind::send_gradient && !has(ActionKind::backward, m, st)) {
            fail(s, r, i, describe(a) + " comes before its backward");
          }
          transfers[{r, a.peer_rank, is_send(a)}].push_back(i);
          break;
        }
      }
      seen.insert({static_cast<int>(a.kind), m, st});
    }
    for (int m = 0; m < s.micro_batches; ++m) {
      for (int st = r; st < stages; st += s.ranks) {
        if (!has(ActionKind::forward, m, st) || !has(ActionKind::backward, m, st)) {
          fail(s, r, list.size(),
               "micro-batch " + std::to_string(m) + " on stage " + std::to_string(st) + " has no " +
                   (has(ActionKind::forward, m, st) ? "backward" : "forward"));
        }
      }
    }
    seen.clear();
  }
  Partners partner(static_cast<size_t>(s.ranks));
  for (int r = 0; r < s.ranks; ++r)
    partner[static_cast<size_t>(r)].assign(s.actions[static_cast<size_t>(r)].size(), {-1, 0});
  for (const auto& [key, sends] : transfers) {
    const auto [r, peer, send] = key;
    if (!send) continue;
    const auto it = transfers.find({peer, r, false});
    const std::vector<size_t> none;
    const std::vector<size_t>& recvs = it == transfers.end() ? none : it->second;
    for (size_t k = 0; k < std::max(sends.size(), recvs.size()); ++k) {
      if (k >= recvs.size()) {
        const Action& a = s.actions[static_cast<size_t>(r)][sends[k]];
        fail(s, r, sends[k],
             describe(a) + " is never received: rank " + std::to_string(peer) + " has " + std::to_string(recvs.size()) +
                 " receive(s) from rank " + std::to_string(r) + " for " + std::to_string(sends.size()) + " send(s)");
      }
      if (k >= sends.size()) {
        const Action& a = s.actions[static_cast<size_t>(peer)][recvs[k]];
        fail(s, peer, recvs[k],
             describe(a) + " is never sent: rank " + std::to_string(r) + " has " + std::to_string(sends.size()) +
                 " send(s) to rank " + std::to_string(peer));
      }
      const Action& a = s.actions[static_cast<size_t>(r)][sends[k]];
      const Action& b = s.actions[static_cast<size_t>(peer)][recvs[k]];
      Action expected = counterpart(a, r);
      expected.joins_previous = b.joins_previous;
      if (!(expected == b)) {
        fail(s, r, sends[k],
             describe(a) + " (send #" + std::to_string(k) + " to rank " + std::to_string(peer) + ") meets rank " +
                 std::to_string(peer) + "'s " + describe(b) + " (action " + std::to_string(recvs[k]) + ")");
      }
      partner[static_cast<size_t>(r)][sends[k]] = {peer, recvs[k]};
      partner[static_cast<size_t>(peer)][recvs[k]] = {r, sends[k]};
    }
  }
  for (const auto& [key, recvs] : transfers) {
    const auto [r, peer, send] = key;
    if (!send && transfers.find({peer, r, true}) == transfers.end()) {
      const Action& a = s.actions[static_cast<size_t>(r)][recvs[0]];
      fail(
          s, r, recvs[0],
          describe(a) + " is never sent: rank " + std::to_string(peer) + " sends nothing to rank " + std::to_string(r));
    }
  }
  return partner;
}

int run(const Schedule& s, const Partners& partner) {
  const auto n = static_cast<size_t>(s.ranks);
  std::vector<size_t> at(n, 0);
  std::vector<std::vector<bool>> matched(n);
  for (size_t r = 0; r < n; ++r) matched[r].assign(s.actions[r].size(), false);
  auto list = [&](size_t r) -> const std::vector<Action>& { return s.actions[r]; };
  auto batch_end = [&](size_t r) {
    size_t e = at[r] + 1;
    while (e < list(r).size() && list(r)[e].is_transfer() && list(r)[e].joins_previous) ++e;
    return e;
  };
  auto in_batch = [&](size_t r, size_t i) {
    return at[r] < list(r).size() && list(r)[at[r]].is_transfer() && i >= at[r] && i < batch_end(r);
  };
  int rounds = 0;
  while (true) {
    // Transfers whose two sides are posted complete; a batch whose transfers all completed finishes.
    bool moved = true;
    while (moved) {
      moved = false;
      for (size_t r = 0; r < n; ++r) {
        if (!in_batch(r, at[r])) continue;
        bool all = true;
        const size_t e = batch_end(r);
        for (size_t i = at[r]; i < e; ++i) {
          const auto [peer, j] = partner[r][i];
          if (!matched[r][i] && in_batch(static_cast<size_t>(peer), j)) {
            matched[r][i] = true;
            matched[static_cast<size_t>(peer)][j] = true;
          }
          all = all && matched[r][i];
        }
        if (all) {
          at[r] = e;
          moved = true;
        }
      }
    }
    bool computed = false, done = true;
    for (size_t r = 0; r < n; ++r) {
      if (at[r] < list(r).size() && !list(r)[at[r]].is_transfer()) {
        ++at[r];
        computed = true;
      }
      done = done && at[r] >= list(r).size();
    }
    if (computed) ++rounds;
    if (done) return rounds;
    if (computed) continue;
    std::string waiting;
    for (size_t r = 0; r < n; ++r) {
      if (at[r] >= list(r).size()) continue;
      size_t i = at[r];
      while (i + 1 < batch_end(r) && matched[r][i]) ++i;  // the first transfer of the batch still waiting
      waiting += (waiting.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " at action " +
                 std::to_string(i) + " (" + describe(list(r)[i]) + ")";
    }
    throw InvalidArgument(std::string(schedule_name(s.kind)) +
                          " schedule deadlocks: every rank waits for another: " + waiting);
  }
}

}  // namespace zero3::pipeline::detail
