// A program outside the zero3 tree, built against the installed package (find_package(zero3), or pkg-config)
// and started by the installed launcher: `zero3 launch -n 2 -- consumer ds_config.json`. Through
// zero3::initialize() it trains a two-layer perceptron (two units, ZeRO stage 3, each rank a share of the
// batch) and checks what a user relies on: the config's zero3 section is in force; at every step the loss over
// the ranks (Engine::all_reduce_host) equals the loss of a plain full-batch AdamW run of the same model in
// double precision, and it falls; the final weights equal that run's.
#include <zero3/zero3.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int kIn = 3, kHidden = 5, kOut = 2, kSamples = 12, kSteps = 25;
constexpr double kLr = 0.02, kWd = 0.01, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;  // as in ds_config.json

double input(int i, int j) { return std::sin(1.3 * i + 0.7 * j + 0.1); }
double target(int i, int k) { return 0.8 * std::cos(0.9 * i - 0.5 * k); }

// The model on samples [begin, end), in T. Unit "hidden" is w1 (kHidden x kIn) then b1, unit "out" is w2
// (kOut x kHidden) then b2, back to back as the engine lays a unit out. h = tanh(w1 x + b1), o = w2 h + b2, and
// the loss is the mean over the samples of |o - y|^2 / 2.
template <typename T>
void hidden_forward(const T* hidden, int begin, int end, std::vector<T>& h) {
  h.assign(static_cast<size_t>((end - begin) * kHidden), T(0));
  for (int i = begin; i < end; ++i) {
    for (int r = 0; r < kHidden; ++r) {
      T a = hidden[kHidden * kIn + r];
      for (int j = 0; j < kIn; ++j) a += hidden[r * kIn + j] * static_cast<T>(input(i, j));
      h[static_cast<size_t>((i - begin) * kHidden + r)] = std::tanh(a);
    }
  }
}

// The loss, the gradient of unit "out" (written to g_out) and the gradient with respect to h (dh).
template <typename T>
T out_forward_backward(const T* out, const std::vector<T>& h, int begin, int end, T* g_out, std::vector<T>& dh) {
  const T inv_n = T(1) / static_cast<T>(end - begin);
  std::fill(g_out, g_out + kOut * kHidden + kOut, T(0));
  dh.assign(h.size(), T(0));
  T loss = 0;
  for (int i = begin; i < end; ++i) {
    const T* hi = &h[static_cast<size_t>((i - begin) * kHidden)];
    for (int k = 0; k < kOut; ++k) {
      T o = out[kOut * kHidden + k];
      for (int r = 0; r < kHidden; ++r) o += out[k * kHidden + r] * hi[r];
      const T d = o - static_cast<T>(target(i, k));
      loss += T(0.5) * d * d * inv_n;
      const T dd = d * inv_n;
      g_out[kOut * kHidden + k] += dd;
      for (int r = 0; r < kHidden; ++r) {
        g_out[k * kHidden + r] += dd * hi[r];
        dh[static_cast<size_t>((i - begin) * kHidden + r)] += dd * out[k * kHidden + r];
      }
    }
  }
  return loss;
}

template <typename T>
void hidden_backward(const std::vector<T>& h, const std::vector<T>& dh, int begin, int end, T* g_hidden) {
  std::fill(g_hidden, g_hidden + kHidden * kIn + kHidden, T(0));
  for (int i = begin; i < end; ++i) {
    for (int r = 0; r < kHidden; ++r) {
      const size_t at = static_cast<size_t>((i - begin) * kHidden + r);
      const T da = dh[at] * (T(1) - h[at] * h[at]);
      g_hidden[kHidden * kIn + r] += da;
      for (int j = 0; j < kIn; ++j) g_hidden[r * kIn + j] += da * static_cast<T>(input(i, j));
    }
  }
}

// Full-batch AdamW in double, as DeepSpeed defines it: decoupled decay, then the bias-corrected Adam update.
struct Reference {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, int t) {
    const double bc1 = 1 - std::pow(kBeta1, t), bc2 = 1 - std::pow(kBeta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - kLr * kWd;
      m[i] = kBeta1 * m[i] + (1 - kBeta1) * g[i];
      v[i] = kBeta2 * v[i] + (1 - kBeta2) * g[i] * g[i];
      p[i] -= kLr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + kEps);
    }
  }
};

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "consumer rank %d: FAILED: %s\n", rank, what.c_str());
  return 1;
}

int run(const std::string& config_path) {
  const int world = zero3::detect_launch().world_size;
  if (kSamples % world != 0) return fail(0, "run on a number of ranks that divides " + std::to_string(kSamples));
  zero3::InitOptions opts;
  opts.resolve.micro_batch = kSamples / world;  // fills "auto": every rank a share of the batch
  zero3::Session s = zero3::initialize(config_path, opts);
  zero3::Engine& engine = *s.engine;
  const int rank = s.comm->rank();
  if (std::string(s.comm->backend()) != "gloo" || s.comm->timeout() != std::chrono::seconds(77)) {
    return fail(rank, "the config's zero3 section is not in force: communicator " + std::string(s.comm->backend()) +
                          " with a " + std::to_string(s.comm->timeout().count()) + " ms timeout (expected gloo, 77 s)");
  }

  zero3::UnitId hidden = engine.add_unit(
      "hidden", {{"w", {kHidden, kIn}, zero3::ParamInit::normal(0.6)}, {"b", {kHidden}, zero3::ParamInit::zeros()}});
  zero3::UnitId out = engine.add_unit(
      "out", {{"w", {kOut, kHidden}, zero3::ParamInit::normal(0.6)}, {"b", {kOut}, zero3::ParamInit::zeros()}});
  engine.materialize();

  // The reference starts from the engine's initial weights.
  std::vector<float> hidden0(static_cast<size_t>(engine.unit(hidden).numel)),
      out0(static_cast<size_t>(engine.unit(out).numel));
  engine.gather_master_params(hidden, hidden0.data());
  engine.gather_master_params(out, out0.data());
  Reference ref;
  ref.p.assign(hidden0.begin(), hidden0.end());
  ref.p.insert(ref.p.end(), out0.begin(), out0.end());
  ref.m.assign(ref.p.size(), 0.0);
  ref.v.assign(ref.p.size(), 0.0);
  const size_t split = hidden0.size();

  const int begin = rank * (kSamples / world), end = begin + kSamples / world;
  std::vector<float> h, dh;
  float first_loss = 0, last_loss = 0;
  for (int step = 1; step <= kSteps; ++step) {
    float loss = 0;
    {
      auto sc = engine.forward_scope(hidden);
      hidden_forward(sc.flat_params().as<float>(), begin, end, h);
    }
    {
      auto sc = engine.backward_scope(out);
      loss = out_forward_backward(sc.flat_params().as<float>(), h, begin, end, sc.flat_grads().as<float>(), dh);
    }
    {
      auto sc = engine.backward_scope(hidden);
      hidden_backward(h, dh, begin, end, sc.flat_grads().as<float>());
    }
    engine.step();
    engine.all_reduce_host(&loss, 1, zero3::ReduceOp::avg);  // every rank's share weighs the same

    std::vector<double> rh, rdh, g(ref.p.size());
    hidden_forward(ref.p.data(), 0, kSamples, rh);
    const double ref_loss = out_forward_backward(ref.p.data() + split, rh, 0, kSamples, g.data() + split, rdh);
    hidden_backward(rh, rdh, 0, kSamples, g.data());
    ref.step(g, step);
    if (std::fabs(loss - ref_loss) > 1e-5 * std::max(1.0, ref_loss)) {
      return fail(rank, "step " + std::to_string(step) + ": loss " + std::to_string(loss) + " over " +
                            std::to_string(world) + " ranks, the full-batch reference has " + std::to_string(ref_loss));
    }
    if (step == 1) first_loss = loss;
    last_loss = loss;
  }
  if (!(last_loss < 0.5f * first_loss)) {
    return fail(rank, "the loss went from " + std::to_string(first_loss) + " to " + std::to_string(last_loss) + " in " +
                          std::to_string(kSteps) + " steps (expected below half)");
  }

  std::vector<float> hidden1(hidden0.size()), out1(out0.size());
  engine.gather_master_params(hidden, hidden1.data());
  engine.gather_master_params(out, out1.data());
  std::vector<float> trained(hidden1);
  trained.insert(trained.end(), out1.begin(), out1.end());
  double worst = 0;
  for (size_t i = 0; i < trained.size(); ++i) worst = std::max(worst, std::fabs(trained[i] - ref.p[i]));
  if (worst > 1e-4) return fail(rank, "the final weights differ from the reference's by " + std::to_string(worst));
  if (rank == 0) {
    std::printf(
        "consumer (zero3 %s): %d rank(s), stage %d, %s; loss %.6f -> %.6f over %d steps, equal to the "
        "full-batch reference (weights within %.1e): ok\n",
        zero3::version().c_str(), world, engine.stage(), s.comm->backend(), first_loss, last_loss, kSteps, worst);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DS_CONFIG.json (started by zero3 launch)\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "consumer: failed with an exception that is not a std::exception\n");
  }
  return 1;
}
