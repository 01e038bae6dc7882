// cobalt_balance_milp: how far a policy's layouts are from meeting the balance cap, per step,
// as two small MILPs solved with COIN-OR CBC (a diagnostic, not a benchmark; docs/results.md).
//
// Reads a `cobalt simulate --dump DIR` directory (routing.safetensors and POLICY.safetensors) and,
// for every step after the first and every layer, with the step's tasks per expert c [E]:
//   cap         assign::balance_cap(tasks, G, tolerance): the largest whole load within
//               (1 + tolerance) x mean
//   floor used  eval::min_max_rank_load(c, layout the policy used in the step)
//   floor prev  the same on the layout the policy used in the step before (where the step starts)
//   any layout  whether some layout with the same S slots per rank (every expert at least once,
//               no topology or copy cost) has a floor <= cap: min sum x[e, r] subject to
//               sum_r y[e, r] = c[e], y[e, r] <= c[e] x[e, r], sum_e y[e, r] <= cap,
//               sum_e x[e, r] <= S, sum_r x[e, r] >= 1 (integral flows exist for integral x)
//   new repl.   the fewest replicas (e, r) absent from the previous step's layout that such a
//               layout must add (the same constraints, minimising the added x[e, r])
// Solver results are "opt N" (proven optimal), "<= N (bound B)" (time limit with a solution),
// "infeasible", or "unknown" (time limit without a solution).
//
// Usage: cobalt_balance_milp DIR POLICY [--tolerance 0.05] [--time-limit 30]
#include <coin/CbcModel.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/CoinPackedVector.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/io/safetensors.hpp"

namespace {

using cobalt::ExpertId;

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> values;  // widened to int64
};

struct Loaded {
  cobalt::io::SafetensorsHeader header;
  cobalt::io::MappedFile file;
};

Loaded load(const std::string& path) {
  Loaded out;
  out.file = cobalt::io::MappedFile(path, path);
  out.header = cobalt::io::parse_safetensors_header(out.file.bytes(), path);
  return out;
}

Tensor tensor(const Loaded& f, const std::string& name) {
  const auto* info = f.header.find(name);
  COBALT_CHECK_ARG(info != nullptr, "balance_milp: no tensor '{}'", name);
  const auto bytes = cobalt::io::tensor_bytes(f.file.bytes(), f.header, *info);
  Tensor t{info->shape, std::vector<int64_t>(static_cast<size_t>(info->num_elements))};
  for (size_t i = 0; i < t.values.size(); ++i) {
    switch (info->dtype) {
      case cobalt::io::Dtype::kI32: {
        int32_t v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        t.values[i] = v;
        break;
      }
      case cobalt::io::Dtype::kI64:
        std::memcpy(&t.values[i], bytes.data() + 8 * i, 8);
        break;
      default:
        COBALT_CHECK_ARG(false, "balance_milp: tensor '{}' is not I32 or I64", name);
    }
  }
  return t;
}

int meta_int(const Loaded& f, const std::string& key) {
  const auto it = f.header.metadata.find(key);
  COBALT_CHECK_ARG(it != f.header.metadata.end(), "balance_milp: no metadata '{}'", key);
  return std::stoi(it->second);
}

// Solves the feasibility MILP of the header comment; objective weight 1 on x[e, r] when
// `previous` is null, else only on the (e, r) that `previous` lacks.
std::string solve(const std::vector<int64_t>& counts, int num_ranks, int slots, int64_t cap,
                  const cobalt::ExpertLayout* previous, double time_limit_s) {
  const int E = static_cast<int>(counts.size()), G = num_ranks;
  const int nx = E * G, n = 2 * nx;  // x[e * G + r], then y[e * G + r]
  CoinPackedMatrix rows(false, 0, 0);
  std::vector<double> row_lo, row_hi;
  const auto add = [&](const CoinPackedVector& v, double lo, double hi) {
    rows.appendRow(v);
    row_lo.push_back(lo);
    row_hi.push_back(hi);
  };
  const double inf = COIN_DBL_MAX;
  for (int e = 0; e < E; ++e) {
    CoinPackedVector v;
    for (int r = 0; r < G; ++r) v.insert(nx + e * G + r, 1.0);
    add(v, static_cast<double>(counts[e]), static_cast<double>(counts[e]));
  }
  for (int e = 0; e < E; ++e) {
    for (int r = 0; r < G; ++r) {
      CoinPackedVector v;
      v.insert(nx + e * G + r, 1.0);
      v.insert(e * G + r, -static_cast<double>(counts[e]));
      add(v, -inf, 0.0);
    }
  }
  for (int r = 0; r < G; ++r) {
    CoinPackedVector load, used;
    for (int e = 0; e < E; ++e) {
      load.insert(nx + e * G + r, 1.0);
      used.insert(e * G + r, 1.0);
    }
    add(load, -inf, static_cast<double>(cap));
    add(used, -inf, static_cast<double>(slots));
  }
  for (int e = 0; e < E; ++e) {
    CoinPackedVector v;
    for (int r = 0; r < G; ++r) v.insert(e * G + r, 1.0);
    add(v, 1.0, inf);
  }
  std::vector<double> col_lo(n, 0.0), col_hi(n, inf), objective(n, 0.0);
  for (int i = 0; i < nx; ++i) {
    col_hi[i] = 1.0;
    const ExpertId e = i / G;
    const int r = i % G;
    bool held = false;
    if (previous != nullptr) {
      for (ExpertId s : previous->slots_of(r)) held = held || s == e;
    }
    objective[i] = held ? 0.0 : 1.0;
  }
  OsiClpSolverInterface solver;
  solver.loadProblem(rows, col_lo.data(), col_hi.data(), objective.data(), row_lo.data(),
                     row_hi.data());
  for (int i = 0; i < nx; ++i) solver.setInteger(i);
  solver.messageHandler()->setLogLevel(0);
  CbcModel model(solver);
  model.setLogLevel(0);
  model.setMaximumSeconds(time_limit_s);
  model.branchAndBound();
  char text[96];
  if (model.isProvenOptimal()) {
    std::snprintf(text, sizeof(text), "opt %.0f", model.getObjValue());
  } else if (model.isProvenInfeasible()) {
    std::snprintf(text, sizeof(text), "infeasible");
  } else if (model.bestSolution() != nullptr) {
    std::snprintf(text, sizeof(text), "<= %.0f (bound %.1f)", model.getObjValue(),
                  model.getBestPossibleObjValue());
  } else {
    std::snprintf(text, sizeof(text), "unknown");
  }
  return text;
}

int run(int argc, char** argv) {
  COBALT_CHECK_ARG(argc >= 3,
                   "usage: cobalt_balance_milp DIR POLICY [--tolerance 0.05] "
                   "[--time-limit 30]");
  const std::string dir = argv[1], policy = argv[2];
  double tolerance = 0.05, time_limit_s = 30;
  for (int i = 3; i < argc; i += 2) {
    const std::string flag = argv[i];
    COBALT_CHECK_ARG(flag == "--tolerance" || flag == "--time-limit",
                     "balance_milp: unknown option '{}' (valid: --tolerance, --time-limit)", flag);
    COBALT_CHECK_ARG(i + 1 < argc, "balance_milp: {} needs a value", flag);
    char* end = nullptr;
    const double value = std::strtod(argv[i + 1], &end);
    COBALT_CHECK_ARG(end != argv[i + 1] && *end == '\0' && value > 0 && value < 1e6,
                     "balance_milp: {} must be a number in (0, 1e6), got '{}'", flag, argv[i + 1]);
    (flag == "--tolerance" ? tolerance : time_limit_s) = value;
  }
  const Loaded routing = load(dir + "/routing.safetensors");
  const Loaded decided = load(dir + "/" + policy + ".safetensors");
  const int E = meta_int(routing, "num_experts"), G = meta_int(routing, "num_ranks");
  const int N = meta_int(routing, "num_nodes"), S = meta_int(routing, "slots_per_rank");
  const Tensor ids = tensor(routing, "topk_ids");          // [L, T, K]
  const Tensor offsets = tensor(routing, "step_offsets");  // [steps + 1]
  const Tensor layouts = tensor(decided, "layout");        // [steps, L, G, S]
  COBALT_CHECK_ARG(ids.shape.size() == 3 && layouts.shape.size() == 4 && layouts.shape[2] == G &&
                       layouts.shape[3] == S,
                   "balance_milp: unexpected tensor shapes in {}", dir);
  COBALT_CHECK_ARG(offsets.values.size() >= 2 &&
                       layouts.shape[0] == static_cast<int64_t>(offsets.values.size()) - 1 &&
                       offsets.values.back() == ids.shape[1],
                   "balance_milp: {}'s step offsets do not match its tokens or {}'s layouts", dir,
                   policy);
  const int L = static_cast<int>(ids.shape[0]), K = static_cast<int>(ids.shape[2]);
  const int64_t T = ids.shape[1];
  const int num_steps = static_cast<int>(offsets.values.size()) - 1;
  const cobalt::Topology topology(N, G);
  const auto layout_of = [&](int step, int layer) {
    const size_t base = (static_cast<size_t>(step) * L + layer) * G * S;
    std::vector<ExpertId> slots(layouts.values.begin() + base,
                                layouts.values.begin() + base + static_cast<size_t>(G) * S);
    return cobalt::ExpertLayout(topology, E, S, std::move(slots));
  };
  std::printf("%-5s %-5s %6s %5s %10s %10s %-26s %-26s\n", "layer", "step", "tasks", "cap",
              "floor used", "floor prev", "any layout: replicas", "new replicas vs prev");
  for (int layer = 0; layer < L; ++layer) {
    for (int step = 1; step < num_steps; ++step) {
      std::vector<int64_t> counts(E, 0);
      for (int64_t t = offsets.values[step]; t < offsets.values[step + 1]; ++t) {
        for (int k = 0; k < K; ++k) {
          const int64_t expert_idx = ids.values[(layer * T + t) * K + k];
          COBALT_CHECK_ARG(expert_idx >= 0 && expert_idx < E,
                           "balance_milp: expert id {} out of range [0, {})", expert_idx, E);
          ++counts[expert_idx];
        }
      }
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      const int64_t cap = cobalt::assign::balance_cap(total, G, tolerance);
      const auto used = layout_of(step, layer), previous = layout_of(step - 1, layer);
      std::printf("%-5d %-5d %6lld %5lld %10lld %10lld %-26s %-26s\n", layer, step,
                  static_cast<long long>(total), static_cast<long long>(cap),
                  static_cast<long long>(cobalt::eval::min_max_rank_load(counts, used)),
                  static_cast<long long>(cobalt::eval::min_max_rank_load(counts, previous)),
                  solve(counts, G, S, cap, nullptr, time_limit_s).c_str(),
                  solve(counts, G, S, cap, &previous, time_limit_s).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
