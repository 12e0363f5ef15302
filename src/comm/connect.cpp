#include <atomic>
#include <memory>

#include "comm/bootstrap/tcp_store.hpp"
#include "comm/registry.hpp"
#include "core/env.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/store.hpp"

namespace zero3 {

std::unique_ptr<Communicator> connect(const CommOptions& requested) {
  CommOptions options = requested;
  if (int64_t s = env::comm_timeout_s(); s > 0) options.timeout = std::chrono::seconds(s);
  LaunchInfo launch = detect_launch();
  log::set_rank(launch.rank);
  std::string backend = options.backend == "auto" ? comm::resolve_backend(options, launch) : options.backend;
  options.backend = backend;
  log::info_rank0("launcher ", launch.launcher, ": ", launch.world_size, " rank(s), ", launch.local_world_size,
                  " on this node; backend ", backend);

  std::shared_ptr<Store> store;
  if (backend != "local") {
    // A lone process serves itself on any free port: nobody else needs to find it, and parallel
    // single-process runs must not collide on a fixed port.
    bool alone = launch.world_size == 1;
    int port = alone ? 0 : launch.store_port;
    std::string host = alone ? "127.0.0.1" : launch.master_addr;
    if (!alone) {
      log::info_rank0("zero3 store at ", host, ":", port, " (port from ", launch.store_port_origin, ")");
    }
    // This process's connects are numbered, so that a rank already at its next connect does not join the store
    // rank 0 still serves for the previous one (TcpStore, `generation`).
    static std::atomic<uint32_t> connects{0};
    auto tcp = std::make_shared<bootstrap::TcpStore>(host, port, launch.rank == 0, options.timeout,
                                                     bootstrap::TcpStoreServerOptions{}, ++connects);
    store = make_prefix_store(std::move(tcp), "zero3");
  }
  return make_communicator(options, launch, std::move(store));
}

}  // namespace zero3
