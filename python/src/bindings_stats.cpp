// stats/: exact routing counts, RoutingStats (EMA or exact loads and co-activation), Ochiai
// summaries, hot-set churn, replica loads.
#include <pybind11/stl.h>

#include "bindings_common.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "py_routing_batch.hpp"

namespace cobalt::py_bindings {

void bind_stats(py::module_& m) {
  m.def(
      "count_routing",
      [](const PyRoutingBatch& b, PyInt num_threads_in) {
        const int num_threads = int_arg(num_threads_in, "num_threads");
        const auto e = static_cast<size_t>(b.batch.num_experts());
        // The [E, E] output (a bare std::bad_alloc MemoryError before, at E = 65536: 32 GiB).
        require_memory(8.0 * static_cast<double>(e) * static_cast<double>(e),
                       fmt::format("count_routing: the {} x {} co-activation matrix", e, e));
        std::vector<int64_t> loads(e), coact(e * e);
        {
          py::gil_scoped_release release;
          count_routing(b.batch, loads, coact, num_threads);
        }
        const auto n = static_cast<py::ssize_t>(e);
        return py::make_tuple(owned_array(std::move(loads), {n}),
                              owned_array(std::move(coact), {n, n}));
      },
      py::arg("batch"), py::arg("num_threads") = 1,
      "Exact counts of one batch: (expert_counts [E] int64, coactivation [E, E] int64).");

  py::class_<RoutingStats>(
      m, "RoutingStats",
      "Running expert loads w_e [E] and co-activation c_ij [E, E]: EMA over updates "
      "(first update initialises; a batch without tasks is no update) or exact sums "
      "(exact=True). Not for concurrent updates from several threads.")
      .def(py::init([](PyInt num_experts, double decay, bool exact) {
             return RoutingStats(int_arg(num_experts, "num_experts"), decay, exact);
           }),
           py::arg("num_experts"), py::arg("decay"), py::arg("exact") = false)
      .def_static(
          "exact_counts",
          [](PyInt num_experts) {
            return RoutingStats::exact_counts(int_arg(num_experts, "num_experts"));
          },
          py::arg("num_experts"))
      .def(
          "update",
          [](RoutingStats& s, const PyRoutingBatch& b, PyInt num_threads_in) {
            const int num_threads = int_arg(num_threads_in, "num_threads");
            // With the GIL held: RoutingStats has no lock, and its scratch buffers would be
            // resized under a concurrent update from another Python thread (heap corruption).
            s.update(b.batch, num_threads);
          },
          py::arg("batch"), py::arg("num_threads") = 1)
      .def(
          "fold_into_last_update",
          [](RoutingStats& s, const PyRoutingBatch& b, PyInt num_threads_in) {
            const int num_threads = int_arg(num_threads_in, "num_threads");
            s.fold_into_last_update(b.batch, num_threads);  // the GIL held, as update()
          },
          py::arg("batch"), py::arg("num_threads") = 1,
          "Adds a micro-batch's counts to the last update's observation (the step's), as update() "
          "with the step's micro-batches concatenated would; the same as update() before any.")
      .def(
          "update_counts",
          [](RoutingStats& s, InArray<int64_t> counts, InArray<int64_t> coact) {
            const auto e = static_cast<size_t>(s.num_experts());
            COBALT_CHECK_ARG(static_cast<size_t>(counts.size()) == e &&
                                 static_cast<size_t>(coact.size()) == e * e,
                             "RoutingStats.update_counts: expected [{}] and [{}, {}] arrays, got "
                             "{} and {} elements",
                             e, e, e, counts.size(), coact.size());
            s.update_counts(span_of(counts), span_of(coact));
          },
          py::arg("expert_counts"), py::arg("coactivation"),
          "Adds one batch's counts (as count_routing makes them: expert_counts [E], a symmetric "
          "co-activation [E, E], all >= 0; ValueError otherwise). All-zero counts are no "
          "observation.")
      .def_property_readonly("num_experts", &RoutingStats::num_experts)
      .def_property_readonly("num_updates", &RoutingStats::num_updates)
      .def_property_readonly("decay", &RoutingStats::decay)
      .def_property_readonly("exact", &RoutingStats::exact)
      .def_property_readonly(
          "expert_load",
          [](py::object self) {
            const auto& s = self.cast<const RoutingStats&>();
            return view_of(s.expert_load(), {s.num_experts()}, self);
          },
          "[E] float64 live read-only view (changes with update; copy to keep a snapshot).")
      .def_property_readonly(
          "coactivation",
          [](py::object self) {
            const auto& s = self.cast<const RoutingStats&>();
            const auto c = s.coactivation();
            return view_of(c, {s.num_experts(), s.num_experts()}, self);
          },
          "[E, E] float64 live read-only view, symmetric, zero diagonal.")
      .def(
          "ochiai",
          [](const RoutingStats& s, ExpertId i, ExpertId j) {
            COBALT_CHECK_ARG(i >= 0 && i < s.num_experts() && j >= 0 && j < s.num_experts(),
                             "experts ({}, {}) out of range [0, {})", i, j, s.num_experts());
            return s.ochiai(i, j);
          },
          py::arg("i"), py::arg("j"))
      .def(
          "ochiai_summary",
          [](const RoutingStats& s) { return summarize_ochiai(s.expert_load(), s.coactivation()); },
          "summarize_ochiai of the current statistics.");

  py::class_<OchiaiSummary>(m, "OchiaiSummary")
      .def_readonly("count_weighted", &OchiaiSummary::count_weighted)
      .def_readonly("top_partner", &OchiaiSummary::top_partner)
      .def("__repr__", [](const OchiaiSummary& o) {
        return fmt::format("OchiaiSummary(count_weighted={:.4f}, top_partner={:.4f})",
                           o.count_weighted, o.top_partner);
      });
  m.def(
      "summarize_ochiai",
      [](InArray<double> load, InArray<double> coact) {
        const auto e = static_cast<size_t>(load.size());
        COBALT_CHECK_ARG(static_cast<size_t>(coact.size()) == e * e,
                         "summarize_ochiai: coactivation has {} elements, expected {} x {}",
                         coact.size(), e, e);
        return summarize_ochiai(span_of(load), span_of(coact));
      },
      py::arg("expert_load"), py::arg("coactivation"),
      "Count-weighted and top-partner Ochiai (DESIGN.md 3.3) of loads [E] and co-activation [E, "
      "E].");
  m.def(
      "hot_set_churn",
      [](InArray<double> prev, InArray<double> next, PyInt hot_count_in) {
        const int hot_count = int_arg(hot_count_in, "hot_count");
        COBALT_CHECK_ARG(prev.size() == next.size(), "hot_set_churn: {} vs {} experts", prev.size(),
                         next.size());
        return hot_set_churn(span_of(prev), span_of(next), hot_count);
      },
      py::arg("prev_load"), py::arg("next_load"), py::arg("hot_count"));

  py::class_<ReplicaLoads>(m, "ReplicaLoads", "EMA loads of replicas keyed by (rank, slot) [G, S].")
      .def(py::init([](PyInt num_ranks, PyInt slots_per_rank, double decay) {
             return ReplicaLoads(int_arg(num_ranks, "num_ranks"),
                                 int_arg(slots_per_rank, "slots_per_rank"), decay);
           }),
           py::arg("num_ranks"), py::arg("slots_per_rank"), py::arg("decay"))
      .def(
          "reset",
          [](ReplicaLoads& r, InArray<double> expected) {
            COBALT_CHECK_ARG(expected.size() == static_cast<py::ssize_t>(r.loads().size()),
                             "ReplicaLoads.reset: {} values for {} slots", expected.size(),
                             r.loads().size());
            r.reset(span_of(expected));
          },
          py::arg("expected_loads"))
      .def(
          "update",
          [](ReplicaLoads& r, InArray<int64_t> counts) {
            COBALT_CHECK_ARG(counts.size() == static_cast<py::ssize_t>(r.loads().size()),
                             "ReplicaLoads.update: {} values for {} slots", counts.size(),
                             r.loads().size());
            r.update(span_of(counts));
          },
          py::arg("replica_counts"))
      .def_property_readonly("loads", [](py::object self) {
        const auto& r = self.cast<const ReplicaLoads&>();
        return view_of(r.loads(), {static_cast<py::ssize_t>(r.loads().size())}, self);
      });

  m.def(
      "replica_task_counts",
      [](const PyRoutingBatch& b, const ExpertLayout& layout, InArray<int32_t> exec_rank) {
        COBALT_CHECK_ARG(exec_rank.size() == b.batch.num_tasks(),
                         "replica_task_counts: exec_rank has {} entries for {} tasks",
                         exec_rank.size(), b.batch.num_tasks());
        auto counts = replica_task_counts(b.batch, layout, span_of(exec_rank));
        return owned_array(std::move(counts), {layout.num_ranks(), layout.slots_per_rank()});
      },
      py::arg("batch"), py::arg("layout"), py::arg("exec_rank"),
      "[G, S] int64: tasks executed by each replica slot.");
}

}  // namespace cobalt::py_bindings
