// eval/: the metrics of DESIGN.md 3.3 (contracts) and trace statistics.
#include <pybind11/stl.h>

#include "bindings_common.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/eval/step_timing.hpp"
#include "cobalt/eval/trace_stats.hpp"
#include "py_routing_batch.hpp"

namespace cobalt::py_bindings {
namespace {

std::span<const RankId> checked_exec(const InArray<int32_t>& exec_rank, int64_t num_tasks,
                                     int num_ranks, const char* what) {
  COBALT_CHECK_ARG(exec_rank.size() == num_tasks, "{}: {} execution ranks for {} tasks", what,
                   exec_rank.size(), num_tasks);
  auto span = span_of(exec_rank);
  for (size_t i = 0; i < span.size(); ++i) {
    COBALT_CHECK_ARG(span[i] >= 0 && span[i] < num_ranks,
                     "{}: task {} has execution rank {} out of range [0, {})", what, i, span[i],
                     num_ranks);
  }
  return span;
}

}  // namespace

void bind_eval(py::module_& m) {
  py::class_<eval::CrossNodeTransfers>(m, "CrossNodeTransfers")
      .def_readonly("dedup", &eval::CrossNodeTransfers::dedup,
                    "V = sum_t |{node(exec(t,e))} minus node(src_t)| (token copies, node dedup)")
      .def_readonly("no_dedup", &eval::CrossNodeTransfers::no_dedup,
                    "tasks whose execution node differs from the source node")
      .def("__repr__", [](const eval::CrossNodeTransfers& c) {
        return fmt::format("CrossNodeTransfers(dedup={}, no_dedup={})", c.dedup, c.no_dedup);
      });

  m.def(
      "cross_node_transfers",
      [](const PyRoutingBatch& b, InArray<int32_t> exec_rank, const Topology& topology) {
        COBALT_CHECK_ARG(topology.num_ranks() == b.batch.num_ranks(),
                         "cross_node_transfers: topology has {} ranks, batch {}",
                         topology.num_ranks(), b.batch.num_ranks());
        auto exec = checked_exec(exec_rank, b.batch.num_tasks(), topology.num_ranks(),
                                 "cross_node_transfers");
        return eval::cross_node_transfers(b.batch, exec, topology);
      },
      py::arg("batch"), py::arg("exec_rank"), py::arg("topology"));
  m.def(
      "rank_loads",
      [](InArray<int32_t> exec_rank, PyInt num_ranks_in) {
        const int num_ranks = int_arg(num_ranks_in, "num_ranks");
        COBALT_CHECK_ARG(num_ranks >= 1, "rank_loads: number of ranks {} must be >= 1", num_ranks);
        auto exec = checked_exec(exec_rank, exec_rank.size(), num_ranks, "rank_loads");
        auto loads = eval::rank_loads(exec, num_ranks);
        return owned_array(std::move(loads), {num_ranks});
      },
      py::arg("exec_rank"), py::arg("num_ranks"), "L_r = tasks executed on rank r: [G] int64.");
  m.def(
      "imbalance", [](InArray<int64_t> loads) { return eval::imbalance(span_of(loads)); },
      py::arg("loads"), "max_r L_r / mean_r L_r (1.0 without tasks).");
  m.def(
      "max_violation", [](InArray<int64_t> counts) { return eval::max_violation(span_of(counts)); },
      py::arg("expert_counts"), "max_e c_e / mean(c) - 1.");
  m.def(
      "min_max_rank_load",
      [](InArray<int64_t> expert_counts, const ExpertLayout& layout) {
        require_ndim(expert_counts, 1, "min_max_rank_load expert_counts [E]");
        return eval::min_max_rank_load(span_of(expert_counts), layout);
      },
      py::arg("expert_counts"), py::arg("layout"),
      "The lowest maximum rank load any assignment of expert_counts [E] reaches on the layout.");
  m.def(
      "imbalance_floor",
      [](InArray<int64_t> expert_counts, const ExpertLayout& layout) {
        require_ndim(expert_counts, 1, "imbalance_floor expert_counts [E]");
        return eval::imbalance_floor(span_of(expert_counts), layout);
      },
      py::arg("expert_counts"), py::arg("layout"),
      "min_max_rank_load / mean rank load: the lowest imbalance any assignment reaches on the "
      "layout (1.0 without tasks).");
  m.def("token_bytes", &eval::token_bytes, py::arg("token_copies"), py::arg("hidden"),
        py::arg("bytes_per_element"));

  py::class_<eval::StepMetrics>(m, "StepMetrics")
      .def_readonly("transfers", &eval::StepMetrics::transfers)
      .def_property_readonly("rank_loads",
                             [](py::object self) {
                               const auto& s = self.cast<const eval::StepMetrics&>();
                               return view_of(std::span<const int64_t>(s.rank_loads),
                                              {static_cast<py::ssize_t>(s.rank_loads.size())},
                                              self);
                             })
      .def_property_readonly("expert_counts",
                             [](py::object self) {
                               const auto& s = self.cast<const eval::StepMetrics&>();
                               return view_of(std::span<const int64_t>(s.expert_counts),
                                              {static_cast<py::ssize_t>(s.expert_counts.size())},
                                              self);
                             })
      .def_readonly("imbalance", &eval::StepMetrics::imbalance)
      .def_readonly("max_violation", &eval::StepMetrics::max_violation);
  m.def(
      "step_metrics",
      [](const PyRoutingBatch& b, InArray<int32_t> exec_rank, const Topology& topology) {
        COBALT_CHECK_ARG(topology.num_ranks() == b.batch.num_ranks(),
                         "step_metrics: topology has {} ranks, batch {}", topology.num_ranks(),
                         b.batch.num_ranks());
        auto exec =
            checked_exec(exec_rank, b.batch.num_tasks(), topology.num_ranks(), "step_metrics");
        return eval::step_metrics(b.batch, exec, topology);
      },
      py::arg("batch"), py::arg("exec_rank"), py::arg("topology"));

  py::class_<eval::TraceStatsOptions> trace_stats_options(m, "TraceStatsOptions");
  trace_stats_options.def(
      py::init([](PyInt hot_count_in, PyInt num_ranks_in, PyInt num_threads_in) {
        const int hot_count = int_arg(hot_count_in, "hot_count");
        const int num_ranks = int_arg(num_ranks_in, "num_ranks");
        const int num_threads = int_arg(num_threads_in, "num_threads");
        eval::TraceStatsOptions options;  // no progress callback from Python
        options.hot_count = hot_count;
        options.num_ranks = num_ranks;
        options.num_threads = num_threads;
        return options;
      }),
      py::arg("hot_count") = 8, py::arg("num_ranks") = 0, py::arg("num_threads") = 1);
  def_int_fields(trace_stats_options, {{"hot_count", &eval::TraceStatsOptions::hot_count},
                                       {"num_ranks", &eval::TraceStatsOptions::num_ranks},
                                       {"num_threads", &eval::TraceStatsOptions::num_threads}});
  py::class_<eval::LayerTraceStats>(m, "LayerTraceStats")
      .def_readonly("load_max_mean", &eval::LayerTraceStats::load_max_mean)
      .def_readonly("load_max_mean_step", &eval::LayerTraceStats::load_max_mean_step)
      .def_readonly("ochiai_count_weighted", &eval::LayerTraceStats::ochiai_count_weighted)
      .def_readonly("ochiai_top_partner", &eval::LayerTraceStats::ochiai_top_partner)
      .def_readonly("hot_set_churn", &eval::LayerTraceStats::hot_set_churn)
      .def_readonly("static_ep_imbalance", &eval::LayerTraceStats::static_ep_imbalance)
      .def_readonly("source_locality", &eval::LayerTraceStats::source_locality);
  py::class_<eval::TraceStats>(m, "TraceStats")
      .def_readonly("num_experts", &eval::TraceStats::num_experts)
      .def_readonly("top_k", &eval::TraceStats::top_k)
      .def_readonly("num_layers", &eval::TraceStats::num_layers)
      .def_readonly("num_tokens", &eval::TraceStats::num_tokens)
      .def_readonly("num_steps", &eval::TraceStats::num_steps)
      .def_readonly("num_sources", &eval::TraceStats::num_sources)
      .def_readonly("load_only", &eval::TraceStats::load_only)
      .def_readonly("load_max_mean", &eval::TraceStats::load_max_mean)
      .def_readonly("load_max_mean_step", &eval::TraceStats::load_max_mean_step)
      .def_readonly("ochiai_count_weighted", &eval::TraceStats::ochiai_count_weighted)
      .def_readonly("ochiai_top_partner", &eval::TraceStats::ochiai_top_partner)
      .def_readonly("hot_set_churn", &eval::TraceStats::hot_set_churn)
      .def_readonly("static_ep_imbalance", &eval::TraceStats::static_ep_imbalance)
      .def_readonly("source_locality", &eval::TraceStats::source_locality)
      .def_readonly("layers", &eval::TraceStats::layers);

  m.def(
      "time_step_operations",
      [](const PyRoutingBatch& b, const Topology& topology, PyInt slots_per_rank_in, double eps,
         PyInt seed_in, PyInt step_in, PyInt layer_in, PyInt num_threads_in, PyInt reps_in,
         double max_seconds, double token_bytes, double expert_param_bytes) {
        const int slots_per_rank = int_arg(slots_per_rank_in, "slots_per_rank");
        const uint64_t seed = uint64_arg(seed_in, "seed");
        const int layer = int_arg(layer_in, "layer");
        const int num_threads = int_arg(num_threads_in, "num_threads");
        const int reps = int_arg(reps_in, "reps");
        eval::StepTimingOptions options;
        options.topology = topology;
        options.slots_per_rank = slots_per_rank;
        options.eps = eps;
        options.seed = seed;
        options.step = int64_arg(step_in, "step");
        options.layer = layer;
        options.num_threads = num_threads;
        options.reps = reps;
        options.max_seconds = max_seconds;
        options.token_bytes = token_bytes;
        options.expert_param_bytes = expert_param_bytes;
        std::vector<eval::TimedOperation> ops;
        {
          py::gil_scoped_release release;  // minutes at large shapes: let other threads run
          ops = eval::time_step_operations(b.batch, options);
        }
        py::list rows;
        for (const auto& op : ops) {
          py::dict row;
          row["name"] = op.name;
          row["what"] = op.what;
          row["policy_step"] = op.policy_step;
          row["median_ms"] = op.median_ms;
          row["min_ms"] = op.min_ms;
          row["reps"] = op.reps;
          row["items"] = op.items;
          row["unit"] = op.unit;
          row["copy_ratio"] = op.copy_ratio;
          row["note"] = op.note;
          rows.append(std::move(row));
        }
        return rows;
      },
      py::arg("batch"), py::arg("topology"), py::arg("slots_per_rank"), py::arg("eps") = 0.15,
      py::arg("seed") = 0, py::arg("step") = 0, py::arg("layer") = 0, py::arg("num_threads") = 1,
      py::arg("reps") = 5, py::arg("max_seconds") = 10.0,
      py::arg("token_bytes") = eval::StepTimingOptions{}.token_bytes,
      py::arg("expert_param_bytes") = eval::StepTimingOptions{}.expert_param_bytes,
      "Wall-clock timing of the per-step calls and policy steps on one batch (what `cobalt "
      "bench` prints): a list of dicts, one per row (eval/step_timing.hpp).");
}

}  // namespace cobalt::py_bindings
