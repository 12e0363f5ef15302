// Collective communication between ranks: flat buffers, ordered on a stream, completed through Work.
//
// One Communicator interface, several backends picked at run time by name:
//   "gloo"  CPU memory, TCP between processes (Debian's libgloo); the engine for CPU runs and tests.
//   "nccl"  GPU memory, NVLink/PCIe/network (EFA through the aws-ofi-nccl plugin); needs a CUDA build.
//   "local" a world of one process; every collective is a copy. Always available.
//
// Buffers. All buffers are flat arrays of `dtype` elements that live where the backend expects them
// (host memory for gloo and local, device memory for nccl) and stay valid and untouched until the Work
// returned for the call has completed. The caller owns every buffer.
//
// Ordering. Calls are issued in the same order on every rank (as with NCCL and MPI). A backend runs the
// operations of one communicator one after another, in issue order. `stream` orders the operation after
// work already queued on that CUDA stream (nccl; nullptr is CUDA's legacy default stream, zero3/stream.hpp);
// host backends ignore it.
//
// Completion and errors. Each call returns a Work. Work::wait() blocks the calling thread until the
// operation finished, and throws its error: CommError naming the collective, the count, the dtype and the
// ranks, or TimeoutError when it did not finish within the communicator's timeout. No collective blocks
// forever: the timeout is CommOptions::timeout (default 600 s), which zero3::initialize() takes from the
// config's zero3.comm_timeout_s. A rank that dies makes
// the collectives it takes part in fail on the other ranks: on gloo at once, naming the dead rank (every pending
// operation of a communicator is ended when a peer's connection breaks without the goodbye a destroyed
// communicator sends); on nccl at its watchdog's next check, at the latest at the timeout. After a failed collective the communicator is broken: every later call fails
// with the first error. Invalid arguments (null buffer with a non-zero count, overlapping buffers other than
// the in-place layout, a root outside the world, max for reduce_scatter) throw InvalidArgument from the
// call itself, before anything is sent, so the ranks stay in step.
//
// Agreement. Ranks that call different collectives at the same position (another operation, count, dtype,
// reduce op or root) must not reach the transport: Gloo would abort the process on a size it did not expect,
// NCCL would hang or move the wrong bytes. Gloo compares every call across ranks before it moves data (each
// rank sends its call's description to every other rank): a difference is a CollectiveMismatchError on every
// rank, naming each rank's call, and the communicator stays usable. A Gloo call of at most 1 KiB per message
// sends its data in that same message (every rank combines the ranks' data in rank order, so all get the same
// bits), so it costs one message; a larger one moves its data after the comparison. NCCL cannot compare calls;
// checks_collectives() says which kind a communicator is (the engine checks the calls itself where it is not).
//
// Gloo runs each communicator's operations on a worker thread of its own; the calling thread only queues
// them. bf16/f16 reductions travel in their dtype on every backend: each addition is done in f32 and each partial
// sum rounded to the dtype before it is passed on (NCCL's rule), so a 16-bit reduction sends half the bytes of an
// f32 one and may differ from the f32-accumulated sum by one rounding per hop. A count of 0 completes at once,
// with no communication and no comparison.
//
// Point-to-point. send_recv() moves flat buffers between pairs of ranks (a pipeline's activations and their
// gradients): only the two ranks of a transfer take part, under the same Work, timeout and failure rules as the
// collectives (a peer that dies or stalls fails the call naming the peer, the direction and the tag; never a hang).
// See send_recv() below for how transfers are matched and ordered.
//
// Thread-safety: one thread issues operations on a communicator at a time; Work may be waited on from
// any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero3/dtype.hpp"
#include "zero3/stream.hpp"

namespace zero3 {

class Store;

enum class ReduceOp : uint8_t { sum, avg, max };

const char* reduce_op_name(ReduceOp op);

// One point-to-point transfer of send_recv(): `count` elements of `dtype` at `buf` sent to, or received from, rank
// `peer` of the communicator. A sent buffer is only read. `tag` is the caller's name for the message (a pipeline
// encodes the micro-batch and whether it is an activation or a gradient); both ranks must give the same one.
struct PeerTransfer {
  enum class Direction : uint8_t { send, recv };
  Direction direction = Direction::send;
  void* buf = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
  int peer = -1;
  uint32_t tag = 0;

  static PeerTransfer send_to(int peer, const void* buf, size_t count, DType dtype, uint32_t tag) {
    return {Direction::send, const_cast<void*>(buf), count, dtype, peer, tag};
  }
  static PeerTransfer recv_from(int peer, void* buf, size_t count, DType dtype, uint32_t tag) {
    return {Direction::recv, buf, count, dtype, peer, tag};
  }
};

// "send(count=4096, dtype=bf16, tag=7) to rank 1", "recv(count=4096, dtype=bf16, tag=7) from rank 0".
std::string describe_transfer(const PeerTransfer& transfer);

// The completion of one collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; throws the operation's error. Calling it again after success returns at once.
  virtual void wait() = 0;
  // Like wait() but gives up after `timeout`: returns false if the operation is still running.
  virtual bool wait_for(std::chrono::milliseconds timeout) = 0;
  // True once the operation finished, successfully or not. Never blocks.
  virtual bool is_completed() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (for operations a backend finished synchronously).
WorkPtr completed_work();

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // The CUDA device whose memory and streams the collectives take (nccl); -1 for backends over host memory.
  virtual int cuda_device() const { return -1; }
  // True when every collective is compared across ranks before data moves (gloo, and local's world of one): a
  // mismatch is a CollectiveMismatchError instead of a crash, a hang or wrong data. False for nccl.
  virtual bool checks_collectives() const { return false; }

  // out[r*count .. (r+1)*count) = rank r's `in`, for every rank r. `out` holds size()*count elements; `in`
  // holds count elements and may be out + rank()*count (in place).
  virtual WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream = nullptr) = 0;

  // out = op over ranks of in[rank()*count .. (rank()+1)*count). `in` holds size()*count elements, `out`
  // count elements; `out` may be in + rank()*count. op is sum or avg. bf16/f16 partial sums are rounded to the dtype (above).
  virtual WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                                 Stream stream = nullptr) = 0;

  // buf = op over ranks of buf (count elements, any count). bf16/f16 partial sums are rounded to the dtype (above).
  virtual WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream = nullptr) = 0;

  // buf = root's buf.
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream = nullptr) = 0;

  // out[r*count .. (r+1)*count) = rank r's in[rank()*count .. (rank()+1)*count), for every rank r: block j of `in`
  // goes to rank j (equal splits, as MPI_Alltoall). `in` and `out` hold size()*count elements each and must not
  // overlap. No arithmetic: the dtype only sizes the elements.
  virtual WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream = nullptr) = 0;

  // Returns when every rank has entered the barrier (or throws TimeoutError / CommError).
  virtual void barrier() = 0;

  // Point-to-point transfers (PeerTransfer above); not collective: only the ranks named as peers take part.
  //
  // Matching. This rank's k-th send to rank p meets rank p's k-th receive from this rank (counted over the
  // communicator's lifetime, in issue order); both must give the same count, dtype and tag. Gloo compares the two
  // descriptions before any data moves: a difference is a CollectiveMismatchError on both ranks naming both sides,
  // that transfer moves nothing, the call's other transfers complete, and the communicator stays usable. NCCL
  // cannot compare them (it matches by order only): a difference there hangs until the timeout or moves wrong bytes,
  // so a schedule must be validated before it runs (zero3/pipeline_schedule.hpp).
  //
  // Ordering. The transfers of one call run side by side (NCCL: one ncclGroupStart/ncclGroupEnd; gloo: a thread
  // each), and each completes as soon as its peer has posted its side, whatever the call's other transfers wait for;
  // the call completes when all of them have. So a rank may send to and receive from the same peer in one call.
  // Calls, point-to-point or collective, run one after another in issue order, as collectives do: a transfer in a
  // later call does not start before the earlier calls finished (gloo) or passed on the stream (nccl). Two ranks that
  // each send to the other in separate calls before receiving wait for each other until the timeout; put such a pair
  // into one call, as a pipeline's schedule does (validate_schedule() in zero3/pipeline_schedule.hpp finds such waits).
  //
  // A transfer to this rank itself is allowed when its send and its receive are in the same call (a copy; NCCL
  // sends to itself). peer outside [0, size()), a null buffer with a non-zero count, or an unmatched transfer to
  // itself throw InvalidArgument from the call, before anything moves. Point-to-point calls take no part in the
  // collectives' comparison: ranks that are not peers of a call do not see it. An empty call completes at once.
  //
  // Failure: as collectives, a TimeoutError or CommError from Work::wait() naming each transfer (direction, peer,
  // count, dtype, tag) and, where a peer died, that rank; after one the communicator is broken. Backends without
  // point-to-point throw Unsupported.
  virtual WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream stream = nullptr);

  // send_recv() of one transfer.
  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag, Stream stream = nullptr) {
    return send_recv({PeerTransfer::send_to(peer, buf, count, dtype, tag)}, stream);
  }
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag, Stream stream = nullptr) {
    return send_recv({PeerTransfer::recv_from(peer, buf, count, dtype, tag)}, stream);
  }

  // A communicator over the ranks that pass the same `color`, ordered by (`key`, rank). Collective over
  // this communicator: every rank calls it, at the same place in its sequence of operations. color < 0
  // returns nullptr for that rank. The new communicator shares this one's store and timeout and may
  // outlive it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// Where a process stands in the job, as its launcher described it.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun | zero3-launch | env (RANK/WORLD_SIZE set by hand) | kubeflow | openmpi | slurm | single
  std::string launcher = "single";
  // Where zero3's TCP store listens: master_port, except under torchrun, whose own store holds MASTER_PORT
  // (then MASTER_PORT + ZERO3_STORE_PORT_OFFSET), or ZERO3_STORE_PORT when set. store_port_origin says which,
  // for the log.
  int store_port = 29500;
  std::string store_port_origin = "default";
};

// Reads the launcher's environment variables, in this order: torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; set by torchrun, `zero3 launch` or by hand),
// Kubeflow Trainer (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), Open MPI
// (OMPI_COMM_WORLD_*), Slurm (SLURM_*), else a single process. docs/launch.md lists every variable and
// default. Throws CommError for inconsistent variables (rank >= world size, a non-number), naming the
// variable. Reads the environment at each call; never caches.
LaunchInfo detect_launch();

struct CommOptions {
  // auto | gloo | nccl | local. auto: nccl when compiled in and a CUDA device is usable, else local for a world
  // of one, else gloo.
  std::string backend = "auto";
  std::chrono::milliseconds timeout = std::chrono::seconds(600);
  int device = -1;                // CUDA device for nccl; -1 = local_rank
  std::string network = "auto";   // nccl: auto | efa | socket (see docs/launch.md)
  bool register_buffers = false;  // nccl: user-buffer registration
};

// Joins the job: detects the launcher, sets the log's rank prefix, rendezvouses through zero3's TCP store on
// master_addr:store_port (rank 0 serves it; a single-process job opens no port unless its backend needs a
// store) and returns the communicator, which keeps the store alive. ZERO3_COMM_TIMEOUT_S, when set, overrides
// options.timeout. It reads no config: zero3::initialize() (initialize.hpp) fills CommOptions from the config's
// zero3 section and calls it. Logs the launcher, the store address and the backend chosen. Blocks until every rank has
// joined or options.timeout passed (TimeoutError); on gloo, until every rank is connected to every other and
// watches it, so that a rank may return, destroy its communicator and exit at once (the others see it leave, and
// a call that still needs it fails naming it). Any other failure is a CommError naming the rank and, where one is
// at fault, the peer.
std::unique_ptr<Communicator> connect(const CommOptions& options = {});

// Same, with a known launch description and an existing store (tests, custom launchers). `store` may be null
// for the "local" backend; the communicator keeps it alive (split() uses it again). Throws CommError for a
// backend not compiled in, naming the available ones.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options, const LaunchInfo& launch,
                                                std::shared_ptr<Store> store);

// Names of the backends compiled into this build, sorted ("gloo", "local", "nccl").
std::vector<std::string> available_backends();

}  // namespace zero3
