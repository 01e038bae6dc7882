// Node-level MILP for Cobalt stage 1 on COIN-OR CBC, run in a forked child under a hard watchdog.
// See include/cobalt/plan/milp_planner.hpp for the formulation and the fork caveats.
#include "cobalt/plan/milp_planner.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

// CBC / Clp / Osi (private dependency of the cobalt library).
#include <CbcModel.hpp>
#include <CbcSolver.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

#include "cobalt/core/error.hpp"
#include "max_flow.hpp"

namespace cobalt::plan {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// -------------------------------------------------------------------------------------------------
// The model, prepared in the parent as plain arrays (CSR rows) before fork().

struct PreparedModel {
  int num_experts = 0;
  int num_nodes = 0;
  int num_pairs = 0;
  int num_cols = 0;
  std::vector<double> col_lower, col_upper, objective;
  std::vector<char> is_integer;
  std::vector<std::string> col_names;
  std::vector<int> row_starts{0};
  std::vector<int> row_cols;
  std::vector<double> row_coefs, row_lower, row_upper;
  // MIP start (model frame): the integer columns x, z; CBC solves the LP for u and y.
  std::vector<int> start_cols;
  std::vector<double> start_values;

  int x_col(int e, int n) const { return e * num_nodes + n; }
  int z_col(int e, int n) const { return num_experts * num_nodes + e * num_nodes + n; }
  int u_col(int e, int n) const { return 2 * num_experts * num_nodes + e * num_nodes + n; }
  int y_col(int p, int n) const { return 3 * num_experts * num_nodes + p * num_nodes + n; }

  void add_row(std::initializer_list<std::pair<int, double>> terms, double lower, double upper) {
    for (const auto& [col, coef] : terms) row_cols.push_back(col), row_coefs.push_back(coef);
    finish_row(lower, upper);
  }
  void finish_row(double lower, double upper) {
    row_starts.push_back(static_cast<int>(row_cols.size()));
    row_lower.push_back(lower);
    row_upper.push_back(upper);
  }
};

// True when the objective has the source-anchoring term, which makes nodes distinguishable.
bool has_source_term(const GlobalPlanInput& input) {
  return !input.source_demand.empty() && input.source_weight != 0;
}

// Builds the model in the model frame (input nodes 0 and swap_with exchanged; see
// solve_global_milp). Objective coefficients are divided by obj_scale, loads by cap.
PreparedModel prepare_model(const GlobalPlanInput& input, const MilpOptions& options, double cap,
                            double obj_scale, const std::vector<std::pair<int, int>>& pairs,
                            const NodePlan* warm_model_frame) {
  PreparedModel m;
  const int num_experts = input.num_experts;
  const int num_nodes = input.topology.num_nodes();
  const int per_node = input.topology.ranks_per_node();
  const int node_slots = per_node * input.slots_per_rank;
  m.num_experts = num_experts;
  m.num_nodes = num_nodes;
  m.num_pairs = static_cast<int>(pairs.size());
  const int num_en = num_experts * num_nodes;
  m.num_cols = 3 * num_en + m.num_pairs * num_nodes;
  m.col_lower.assign(m.num_cols, 0.0);
  m.col_upper.assign(m.num_cols, 1.0);
  m.objective.assign(m.num_cols, 0.0);
  m.is_integer.assign(m.num_cols, 1);
  m.col_names.resize(m.num_cols);
  for (int e = 0; e < num_experts; ++e) {
    const double w_scaled = input.expert_load[e] / cap;
    for (int n = 0; n < num_nodes; ++n) {
      m.col_upper[m.x_col(e, n)] = per_node;
      m.col_names[m.x_col(e, n)] = fmt::format("x_{}_{}", e, n);
      m.col_names[m.z_col(e, n)] = fmt::format("z_{}_{}", e, n);
      m.col_upper[m.u_col(e, n)] = w_scaled;
      m.is_integer[m.u_col(e, n)] = 0;
      m.col_names[m.u_col(e, n)] = fmt::format("u_{}_{}", e, n);
    }
  }
  for (int p = 0; p < m.num_pairs; ++p) {
    const auto [i, j] = pairs[p];
    const double c = input.coactivation[static_cast<size_t>(i) * num_experts + j] / obj_scale;
    for (int n = 0; n < num_nodes; ++n) {
      m.objective[m.y_col(p, n)] = -c;  // CBC minimises
      // Continuous: for integer z the best y is min(z_in, z_jn), which is 0/1 (and meets the degree
      // cut), so integrality is implied. Measured 1.7-3.2x faster to optimality than binary y.
      m.is_integer[m.y_col(p, n)] = 0;
      m.col_names[m.y_col(p, n)] = fmt::format("y_{}_{}", p, n);
    }
  }
  if (has_source_term(input)) {
    // Source anchoring: + source_weight * d_ne for each present (e, n). Nodes are then not
    // interchangeable, so no symmetry breaker (and the model frame is the input frame).
    for (int e = 0; e < num_experts; ++e) {
      for (int n = 0; n < num_nodes; ++n) {
        const double gain =
            input.source_weight * input.source_demand[static_cast<size_t>(n) * num_experts + e];
        m.objective[m.z_col(e, n)] = -gain / obj_scale;
      }
    }
  } else {
    // Symmetry breaker: nodes are interchangeable, so some optimum has expert 0 on node 0.
    m.col_lower[m.z_col(0, 0)] = 1.0;
    m.col_lower[m.x_col(0, 0)] = 1.0;
  }

  for (int e = 0; e < num_experts; ++e) {
    for (int n = 0; n < num_nodes; ++n) {
      m.add_row({{m.z_col(e, n), 1.0}, {m.x_col(e, n), -1.0}}, -kInf, 0.0);       // z <= x
      m.add_row({{m.x_col(e, n), 1.0}, {m.z_col(e, n), -per_node}}, -kInf, 0.0);  // x <= M z
      m.add_row({{m.u_col(e, n), 1.0}, {m.x_col(e, n), -1.0}}, -kInf, 0.0);       // u <= cap x
    }
    for (int n = 0; n < num_nodes; ++n)
      m.row_cols.push_back(m.z_col(e, n)), m.row_coefs.push_back(1);
    m.finish_row(1.0, kInf);  // >= 1 replica
    const double w_scaled = input.expert_load[e] / cap;
    for (int n = 0; n < num_nodes; ++n)
      m.row_cols.push_back(m.u_col(e, n)), m.row_coefs.push_back(1);
    m.finish_row(w_scaled, w_scaled);  // load split
  }
  for (int n = 0; n < num_nodes; ++n) {
    for (int e = 0; e < num_experts; ++e)
      m.row_cols.push_back(m.x_col(e, n)), m.row_coefs.push_back(1);
    m.finish_row(-kInf, node_slots);  // slots
    for (int e = 0; e < num_experts; ++e)
      m.row_cols.push_back(m.u_col(e, n)), m.row_coefs.push_back(1);
    m.finish_row(-kInf, per_node);  // node load (units of cap)
  }
  std::vector<std::vector<int>> pairs_of(num_experts);
  for (int p = 0; p < m.num_pairs; ++p) {
    const auto [i, j] = pairs[p];
    pairs_of[i].push_back(p);
    pairs_of[j].push_back(p);
    for (int n = 0; n < num_nodes; ++n) {
      m.add_row({{m.y_col(p, n), 1.0}, {m.z_col(i, n), -1.0}}, -kInf, 0.0);
      m.add_row({{m.y_col(p, n), 1.0}, {m.z_col(j, n), -1.0}}, -kInf, 0.0);
    }
  }
  if (options.degree_cuts) {
    for (int e = 0; e < num_experts; ++e) {
      const int degree = static_cast<int>(pairs_of[e].size());
      if (degree + per_node <= node_slots) continue;  // implied by y <= z and x <= M z
      for (int n = 0; n < num_nodes; ++n) {
        for (int p : pairs_of[e]) m.row_cols.push_back(m.y_col(p, n)), m.row_coefs.push_back(1);
        m.row_cols.push_back(m.x_col(e, n)), m.row_coefs.push_back(1);
        m.row_cols.push_back(m.z_col(e, n)), m.row_coefs.push_back(-node_slots);
        m.finish_row(-kInf, 0.0);
      }
    }
  }
  if (warm_model_frame != nullptr) {
    const NodePlan& warm = *warm_model_frame;
    for (int e = 0; e < num_experts; ++e) {
      for (int n = 0; n < num_nodes; ++n) {
        const int x = warm.x(e, n);
        m.start_cols.push_back(m.x_col(e, n)), m.start_values.push_back(x);
        m.start_cols.push_back(m.z_col(e, n)), m.start_values.push_back(x > 0 ? 1 : 0);
      }
    }
  }
  return m;
}

// -------------------------------------------------------------------------------------------------
// Child side: solve and report through the pipe.

constexpr uint32_t kMagic = 0xC0BA17u;

struct ChildHeader {
  uint32_t magic = kMagic;
  int32_t failed = 0;  // 1: exception in the child
  int32_t has_solution = 0;
  int32_t proven_optimal = 0;
  int32_t proven_infeasible = 0;
  int32_t seconds_limit = 0;
  double objective_scaled = 0;  // minimisation value (negated, scaled objective)
  double bound_scaled = 0;      // best possible minimisation value
  char error[240] = {};         // failed: the exception's message, truncated, NUL-terminated
};

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, p, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

int silent_callback(CbcModel*, int) { return 0; }

[[noreturn]] void run_child(const PreparedModel& m, const MilpOptions& options, int write_fd,
                            pid_t parent_pid) {
  // Die with the caller: an orphaned solver could otherwise run for minutes inside the root LP.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent_pid) ::_exit(4);
  if (!options.verbose) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, STDOUT_FILENO);
      ::dup2(null_fd, STDERR_FILENO);
      ::close(null_fd);
    }
  }
  ChildHeader header;
  const int num_en = m.num_experts * m.num_nodes;
  std::vector<double> payload(2 * static_cast<size_t>(num_en), 0.0);
  try {
    OsiClpSolverInterface solver;
    solver.setIntParam(OsiNameDiscipline, 1);
    const std::vector<CoinBigIndex> starts(m.row_starts.begin(), m.row_starts.end());
    CoinPackedMatrix rows(false, m.num_cols, static_cast<int>(m.row_lower.size()),
                          static_cast<CoinBigIndex>(m.row_cols.size()), m.row_coefs.data(),
                          m.row_cols.data(), starts.data(), nullptr);
    std::vector<double> row_lower = m.row_lower, row_upper = m.row_upper;
    for (double& v : row_lower) v = std::isinf(v) ? -COIN_DBL_MAX : v;
    for (double& v : row_upper) v = std::isinf(v) ? COIN_DBL_MAX : v;
    solver.loadProblem(rows, m.col_lower.data(), m.col_upper.data(), m.objective.data(),
                       row_lower.data(), row_upper.data());
    for (int col = 0; col < m.num_cols; ++col) {
      if (m.is_integer[col]) solver.setInteger(col);
      solver.setColName(col, m.col_names[col]);
    }
    // Column names are needed to match the MIP start. Once a Clp model has names, every row needs
    // one too: Clp 1.17's presolve copies row names unconditionally and crashes on a missing one.
    const int num_rows = static_cast<int>(m.row_lower.size());
    for (int row = 0; row < num_rows; ++row) solver.setRowName(row, fmt::format("r{}", row));
    if (!options.verbose) solver.messageHandler()->setLogLevel(0);

    CbcModel model(solver);
    if (!options.verbose) model.messageHandler()->setLogLevel(0);
    if (!m.start_cols.empty()) {
      std::vector<std::pair<std::string, double>> start;
      start.reserve(m.start_cols.size());
      for (size_t k = 0; k < m.start_cols.size(); ++k) {
        start.emplace_back(m.col_names[m.start_cols[k]], m.start_values[k]);
      }
      model.setMIPStart(start);
    }
    CbcSolverUsefulData data;
    data.noPrinting_ = !options.verbose;
    data.useSignalHandler_ = false;
    CbcMain0(model, data);
    if (!options.verbose) model.messageHandler()->setLogLevel(0);
    const std::string seconds = fmt::format("{}", options.time_limit_s);
    const std::string threads = fmt::format("{}", options.num_threads);
    const std::string log_level = options.verbose ? "1" : "0";
    std::vector<const char*> argv = {"cobalt_milp"};
    auto add_arg = [&argv](const char* name, const char* value) {
      argv.push_back(name);
      argv.push_back(value);
    };
    add_arg("-log", log_level.c_str());
    add_arg("-slog", "0");
    add_arg("-timeMode", "elapsed");  // -sec is wall-clock, like the watchdog
    add_arg("-sec", seconds.c_str());
    add_arg("-ratioGap", "1e-9");
    add_arg("-allowableGap", "1e-9");  // objective is scaled to max c = 1
    if (options.num_threads > 1) add_arg("-threads", threads.c_str());
    argv.push_back("-solve");
    argv.push_back("-quit");
    CbcMain1(static_cast<int>(argv.size()), argv.data(), model, silent_callback, data);

    header.proven_optimal = model.isProvenOptimal() ? 1 : 0;
    header.proven_infeasible = model.isProvenInfeasible() ? 1 : 0;
    header.seconds_limit = model.isSecondsLimitReached() ? 1 : 0;
    header.bound_scaled = model.getBestPossibleObjValue();
    const double* best = model.bestSolution();
    if (best != nullptr && model.getNumCols() == m.num_cols) {
      header.has_solution = 1;
      header.objective_scaled = model.getObjValue();
      for (int idx = 0; idx < num_en; ++idx) {
        payload[idx] = best[idx];                        // x (first E*N columns)
        payload[num_en + idx] = best[2 * num_en + idx];  // u (scaled)
      }
    }
  } catch (const std::bad_alloc&) {
    header.failed = 1;
    std::snprintf(header.error, sizeof(header.error), "out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    header.failed = 1;
    std::snprintf(header.error, sizeof(header.error), "%s", e.what());
  } catch (...) {
    header.failed = 1;
    std::snprintf(header.error, sizeof(header.error), "an exception of unknown type");
  }
  // Flush the log first: _exit skips stdio, and the parent may kill us once the payload is in.
  if (options.verbose) std::fflush(nullptr);
  const bool ok = write_all(write_fd, &header, sizeof(header)) &&
                  write_all(write_fd, payload.data(), payload.size() * sizeof(double));
  ::close(write_fd);
  ::_exit(ok ? 0 : 3);
}

// -------------------------------------------------------------------------------------------------
// Parent side: wait with a deadline.

struct ChildOutcome {
  bool completed = false;  // full payload received
  bool timed_out = false;
  ChildHeader header;
  std::vector<double> payload;
  // How the child ended when it ended on its own (waitpid status), before any kill of ours.
  bool exited_on_its_own = false;
  int wait_status = 0;
};

// Why the solver process gave no answer, for MilpResult::error.
std::string child_failure(const ChildOutcome& outcome) {
  if (outcome.completed && outcome.header.failed) {
    return fmt::format("the solver failed: {}", outcome.header.error);
  }
  if (!outcome.exited_on_its_own) return "the solver process ended without an answer";
  const int status = outcome.wait_status;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("the solver process was killed by signal {} ({}){}", sig, strsignal(sig),
                       sig == SIGKILL ? "; out of memory? (the kernel's OOM killer sends it)" : "");
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return fmt::format("the solver process exited with status {}{}", code,
                       code == 3   ? " (its answer could not be written to the pipe)"
                       : code == 4 ? " (its parent had changed)"
                                   : "");
  }
  return "the solver process ended without an answer";
}

ChildOutcome run_with_watchdog(const PreparedModel& m, const MilpOptions& options,
                               Clock::time_point deadline) {
  int fds[2];
  COBALT_CHECK_INTERNAL(::pipe2(fds, O_CLOEXEC) == 0, "milp: pipe2 failed: {}",
                        std::strerror(errno));
  // The child flushes stdio before _exit when verbose: hand it empty buffers so nothing the caller
  // buffered is printed twice.
  if (options.verbose) std::fflush(nullptr);
  const pid_t parent_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail(ErrorCode::kInternal, "milp: fork failed: {}", std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    run_child(m, options, fds[1], parent_pid);
  }
  ::close(fds[1]);
  const int read_fd = fds[0];
  ::fcntl(read_fd, F_SETFL, ::fcntl(read_fd, F_GETFL) | O_NONBLOCK);

  ChildOutcome outcome;
  const size_t num_en = static_cast<size_t>(m.num_experts) * m.num_nodes;
  const size_t expected = sizeof(ChildHeader) + 2 * num_en * sizeof(double);
  std::vector<char> buffer;
  buffer.reserve(expected);
  bool reaped = false;
  // Reads what is available; returns false at EOF or error.
  auto drain = [&]() {
    char chunk[65536];
    for (;;) {
      const ssize_t got = ::read(read_fd, chunk, sizeof(chunk));
      if (got > 0) {
        buffer.insert(buffer.end(), chunk, chunk + got);
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  };
  for (;;) {
    const bool open = drain();
    if (buffer.size() >= expected) break;
    int wstatus = 0;
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      reaped = true;
      outcome.exited_on_its_own = true;
      outcome.wait_status = wstatus;
      drain();  // whatever the child wrote before exiting
      break;
    }
    if (!open) {
      // EOF without a full payload: the child is exiting. Give it a moment to end on its own, so
      // that its status says why; then reap it below.
      for (int attempt = 0; attempt < 100 && !reaped; ++attempt) {
        if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
          reaped = true;
          outcome.exited_on_its_own = true;
          outcome.wait_status = wstatus;
        } else {
          ::poll(nullptr, 0, 10);
        }
      }
      break;
    }
    const double left_ms =
        std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
    if (left_ms <= 0) {
      outcome.timed_out = true;
      break;
    }
    // Poll in short slices so a child that died while another process holds the pipe open is
    // still noticed.
    pollfd pfd{read_fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::clamp(left_ms, 1.0, 20.0)));
  }
  ::close(read_fd);
  if (!reaped) {
    // Timed out, or done with it (full payload / EOF): the child is not needed any more, and the
    // kill keeps the blocking wait below bounded whatever state it is in. It is unreaped, so the
    // pid is still ours.
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  if (!outcome.timed_out && buffer.size() >= expected) {
    std::memcpy(&outcome.header, buffer.data(), sizeof(ChildHeader));
    if (outcome.header.magic == kMagic) {
      outcome.completed = true;
      outcome.payload.resize(2 * num_en);
      std::memcpy(outcome.payload.data(), buffer.data() + sizeof(ChildHeader),
                  2 * num_en * sizeof(double));
    }
  }
  return outcome;
}

// Cheap valid upper bound: each node holds at most K = min(E, M S) experts, so it scores at most
// the K (K - 1) / 2 largest pair weights.
double combinatorial_bound(const GlobalPlanInput& input) {
  const int num_experts = input.num_experts;
  std::vector<double> weights;
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j) {
      const double c = input.coactivation[static_cast<size_t>(i) * num_experts + j];
      if (c > 0) weights.push_back(c);
    }
  }
  const int64_t k = std::min<int64_t>(
      num_experts, static_cast<int64_t>(input.topology.ranks_per_node()) * input.slots_per_rank);
  const size_t keep = static_cast<size_t>(std::min<int64_t>(k * (k - 1) / 2, weights.size()));
  std::partial_sort(weights.begin(), weights.begin() + keep, weights.end(), std::greater<>());
  double per_node = 0;
  for (size_t idx = 0; idx < keep; ++idx) per_node += weights[idx];
  double bound = per_node * input.topology.num_nodes();
  if (has_source_term(input)) {
    for (double d : input.source_demand) bound += std::max(0.0, input.source_weight * d);
  }
  return bound;
}

NodePlan swap_nodes(const NodePlan& plan, int a, int b) {
  NodePlan out = plan;
  if (a == b) return out;
  for (int e = 0; e < plan.num_experts; ++e) {
    std::swap(out.x(e, a), out.x(e, b));
    std::swap(out.u(e, a), out.u(e, b));
  }
  return out;
}

}  // namespace

double relative_gap(double objective, double bound) {
  if (std::isnan(objective) || std::isnan(bound) || bound == -kInf) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (bound == kInf) return kInf;
  return (bound - objective) / std::max(1.0, std::abs(bound));
}

bool assign_load_shares(const GlobalPlanInput& input, NodePlan& plan) {
  const int num_experts = input.num_experts;
  const int num_nodes = input.topology.num_nodes();
  COBALT_CHECK_ARG(plan.num_experts == num_experts && plan.num_nodes == num_nodes &&
                       plan.replicas.size() == static_cast<size_t>(num_experts) * num_nodes,
                   "assign_load_shares: plan shape {}x{} does not match E={} N={}",
                   plan.num_experts, plan.num_nodes, num_experts, num_nodes);
  plan.load_share.assign(static_cast<size_t>(num_experts) * num_nodes, 0.0);
  const double cap = input.rank_load_cap();
  const double total = input.total_load();
  const int per_node = input.topology.ranks_per_node();
  const int source = num_experts + num_nodes;
  const int sink = source + 1;
  MaxFlow flow(num_experts + num_nodes + 2);
  std::vector<int> edge_of(static_cast<size_t>(num_experts) * num_nodes, -1);
  for (int e = 0; e < num_experts; ++e) {
    flow.add_edge(source, e, input.expert_load[e]);
    for (int n = 0; n < num_nodes; ++n) {
      if (plan.x(e, n) > 0) {
        edge_of[static_cast<size_t>(e) * num_nodes + n] =
            flow.add_edge(e, num_experts + n, plan.x(e, n) * cap);
      }
    }
  }
  for (int n = 0; n < num_nodes; ++n) flow.add_edge(num_experts + n, sink, per_node * cap);
  const double scale = std::max(1.0, total);
  const double routed = flow.run(source, sink, 1e-13 * scale);
  if (routed < total - 1e-9 * scale) return false;
  for (size_t idx = 0; idx < edge_of.size(); ++idx) {
    if (edge_of[idx] >= 0) plan.load_share[idx] = flow.flow(edge_of[idx]);
  }
  return true;
}

MilpResult solve_global_milp(const GlobalPlanInput& input, const MilpOptions& options) {
  const auto start = Clock::now();
  input.validate();
  COBALT_CHECK_ARG(options.time_limit_s > 0 && std::isfinite(options.time_limit_s),
                   "milp: time limit {} s must be > 0", options.time_limit_s);
  COBALT_CHECK_ARG(options.num_threads >= 1, "milp: num_threads {} must be >= 1",
                   options.num_threads);
  const int num_experts = input.num_experts;
  const int num_nodes = input.topology.num_nodes();
  if (options.warm_start != nullptr) {
    const std::string why = check_node_plan(input, *options.warm_start);
    COBALT_CHECK_ARG(why.empty(), "milp: warm start is not a valid plan: {}", why);
  }
  // Saturated: a deadline past the clock's range (time limits of ~1e10 s and more) would overflow
  // the conversion to Clock::duration (signed 64-bit nanoseconds, ~292 years); 10^8 s (~3 years)
  // is "no deadline" for any solve.
  constexpr double kMaxWaitSeconds = 1e8;
  const double hard_timeout = std::min(
      options.hard_timeout_s > 0 ? options.hard_timeout_s : options.time_limit_s * 1.5 + 5.0,
      kMaxWaitSeconds);
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(hard_timeout));

  // Frame: model node 0 is the warm start's first node holding expert 0 (a swap, its own inverse),
  // so the warm start satisfies the symmetry breaker. None with source anchoring (no breaker).
  int swap_with = 0;
  if (options.warm_start != nullptr && !has_source_term(input)) {
    for (int n = 0; n < num_nodes; ++n) {
      if (options.warm_start->x(0, n) > 0) {
        swap_with = n;
        break;
      }
    }
  }
  NodePlan warm_model_frame;
  if (options.warm_start != nullptr)
    warm_model_frame = swap_nodes(*options.warm_start, 0, swap_with);

  std::vector<std::pair<int, int>> pairs;
  double c_max = 0;
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j) {
      const double c = input.coactivation[static_cast<size_t>(i) * num_experts + j];
      if (c > 0) {
        pairs.emplace_back(i, j);
        c_max = std::max(c_max, c);
      }
    }
  }
  double obj_max = c_max;
  if (has_source_term(input)) {
    for (double d : input.source_demand)
      obj_max = std::max(obj_max, std::abs(input.source_weight * d));
  }
  COBALT_CHECK_ARG(
      std::isfinite(obj_max),
      "milp: objective weights must be finite (max |c_ij|, |source_weight * d_ne| = {})", obj_max);
  const double obj_scale = obj_max > 0 ? obj_max : 1.0;
  // The model is built here, before the watchdog's child starts: bound its size so the whole call
  // stays within the hard timeout (and the column indices within int).
  const int64_t num_columns =
      3 * int64_t{num_experts} * num_nodes + static_cast<int64_t>(pairs.size()) * num_nodes;
  COBALT_CHECK(num_columns <= kMaxMilpColumns, kFailedPrecondition,
               "milp: the model would have {} columns (E={}, N={}, {} co-activated pairs), above "
               "the {} this backend builds; use the heuristic backend",
               num_columns, num_experts, num_nodes, pairs.size(), kMaxMilpColumns);
  const double cap = input.rank_load_cap();
  // All loads zero: cap is 0; any unit keeps the (then trivial) load rows consistent.
  const double load_unit = cap > 0 ? cap : 1.0;

  const PreparedModel model =
      prepare_model(input, options, load_unit, obj_scale, pairs,
                    options.warm_start != nullptr ? &warm_model_frame : nullptr);
  const ChildOutcome outcome = run_with_watchdog(model, options, deadline);

  MilpResult result;
  result.plan = NodePlan(num_experts, num_nodes);
  result.bound = kInf;
  bool cbc_plan_ok = false;
  if (outcome.timed_out) {
    result.status = "watchdog";
  } else if (!outcome.completed || outcome.header.failed) {
    result.status = "error";
    result.error = child_failure(outcome);
  } else {
    const ChildHeader& h = outcome.header;
    if (h.proven_infeasible) {
      result.status = "infeasible";
    } else if (h.proven_optimal) {
      result.status = "optimal";
    } else if (h.seconds_limit) {
      result.status = "time_limit";
    } else {
      result.status = "stopped";
    }
    // CBC reports +-COIN_DBL_MAX (1e300) when it has no bound yet.
    if (std::abs(h.bound_scaled) < 1e40) result.bound = -h.bound_scaled * obj_scale;
    if (h.proven_infeasible) result.bound = -kInf;
    if (h.has_solution) {
      const size_t num_en = static_cast<size_t>(num_experts) * num_nodes;
      NodePlan plan(num_experts, num_nodes);
      for (size_t idx = 0; idx < num_en; ++idx) {
        plan.replicas[idx] = static_cast<int>(std::lround(outcome.payload[idx]));
      }
      if (!assign_load_shares(input, plan)) {
        // Numerically borderline split: fall back to CBC's own shares (validated below).
        for (size_t idx = 0; idx < num_en; ++idx) {
          plan.load_share[idx] = plan.replicas[idx] > 0
                                     ? std::max(0.0, outcome.payload[num_en + idx] * load_unit)
                                     : 0.0;
        }
      }
      plan = swap_nodes(plan, 0, swap_with);
      if (check_node_plan(input, plan).empty()) {
        cbc_plan_ok = true;
        result.plan = std::move(plan);
      }
    }
  }
  const double cbc_objective = cbc_plan_ok ? coactivation_objective(input, result.plan) : -kInf;
  if (options.warm_start != nullptr) {
    const double warm_objective = coactivation_objective(input, *options.warm_start);
    // Ties go to the warm start: same value, and the caller's node labels (no migration).
    if (!cbc_plan_ok || warm_objective >= cbc_objective - 1e-12 * std::abs(cbc_objective)) {
      result.plan = *options.warm_start;
      cbc_plan_ok = true;
    }
  }
  result.has_solution = cbc_plan_ok;
  if (result.has_solution) {
    result.objective = coactivation_objective(input, result.plan);
    // Both are valid upper bounds; the combinatorial one stands in when CBC gave none.
    result.bound = std::min(result.bound, combinatorial_bound(input));
    // A feasible plan's value is a lower bound on the optimum, so the bound is at least that.
    result.bound = std::max(result.bound, result.objective);
    result.gap = relative_gap(result.objective, result.bound);
    // CBC's own optimality tolerance is 1e-9 relative; the check guards the fallback paths above.
    result.optimal = result.status == "optimal" && result.gap <= 1e-6;
  } else {
    result.objective = 0;
    result.optimal = false;
    result.gap = kInf;
  }
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace cobalt::plan
