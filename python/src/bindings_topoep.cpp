// plan/topoep_solver: TopoEP's per-microbatch solver (the CPU reference of the CUDA solver).
#include <pybind11/stl.h>

#include "bindings_common.hpp"
#include "cobalt/plan/topoep_solver.hpp"

namespace cobalt::py_bindings {

void bind_topoep(py::module_& m) {
  m.def(
      "solve_topoep",
      [](InArray<int64_t> demand, const Topology& topology, PyInt slots_per_rank_in,
         double token_bytes, double expert_param_bytes) {
        const int slots_per_rank = int_arg(slots_per_rank_in, "slots_per_rank");
        require_ndim(demand, 2, "solve_topoep demand [G, E]");
        COBALT_CHECK_ARG(demand.shape(0) == topology.num_ranks(),
                         "solve_topoep: demand has {} rows for {} ranks", demand.shape(0),
                         topology.num_ranks());
        plan::TopoEpInput in;
        in.topology = topology;
        in.num_experts = static_cast<int>(demand.shape(1));
        in.slots_per_rank = slots_per_rank;
        in.token_bytes = token_bytes;
        in.expert_param_bytes = expert_param_bytes;
        // A private copy: the caller's array could change while the GIL is released.
        const std::vector<int64_t> owned_demand = vector_of(demand);
        in.demand = owned_demand;
        plan::TopoEpPlan p;
        {
          py::gil_scoped_release release;
          plan::TopoEpSolver().solve(in, p);
        }
        const py::ssize_t g = topology.num_ranks(), s = slots_per_rank;
        const auto q = static_cast<py::ssize_t>(p.quotas.size());
        std::vector<int32_t> expert(q), dst(q);
        std::vector<int64_t> count(q);
        for (py::ssize_t i = 0; i < q; ++i) {
          expert[i] = p.quotas[i].expert;
          dst[i] = p.quotas[i].dst;
          count[i] = p.quotas[i].count;
        }
        py::dict out;
        out["slots"] = owned_array(std::move(p.slots), {g, s});
        out["source_offsets"] = owned_array(std::move(p.source_offsets), {g + 1});
        out["quota_expert"] = owned_array(std::move(expert), {q});
        out["quota_dst"] = owned_array(std::move(dst), {q});
        out["quota_count"] = owned_array(std::move(count), {q});
        out["rank_loads"] = owned_array(std::move(p.rank_loads), {g});
        out["stats"] = owned_array(
            std::vector<int64_t>{p.stats.num_inter_node_replicas, p.stats.num_intra_node_replicas,
                                 p.stats.num_refinement_moves, p.stats.num_dropped_replicas},
            {4});
        return out;
      },
      py::arg("demand"), py::arg("topology"), py::arg("slots_per_rank"), py::arg("token_bytes"),
      py::arg("expert_param_bytes"),
      "TopoEP's per-microbatch plan for demand Omega [G, E] (include/cobalt/plan/topoep_solver.hpp)"
      ": a dict of slots [G, S] (int32, -1 empty), source_offsets [G + 1], quota_expert / "
      "quota_dst (int32) and quota_count (int64) [Q] grouped by source rank, rank_loads [G] and "
      "stats [4] (inter-node replicas, intra-node replicas, refinement moves, dropped replicas).");
}

}  // namespace cobalt::py_bindings
