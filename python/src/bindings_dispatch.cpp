// assign/dispatch_layout: what a DeepEP-style exchange needs from an assignment (the CPU reference
// of the CUDA dispatch-layout kernel).
#include "bindings_common.hpp"
#include "cobalt/assign/dispatch_layout.hpp"

namespace cobalt::py_bindings {

void bind_dispatch(py::module_& m) {
  m.def(
      "dispatch_layout",
      [](InArray<int32_t> exec_rank, InArray<int32_t> source_rank, const Topology& topology) {
        require_ndim(exec_rank, 2, "dispatch_layout exec_rank [T, K]");
        require_ndim(source_rank, 1, "dispatch_layout source_rank [T]");
        COBALT_CHECK_ARG(source_rank.shape(0) == exec_rank.shape(0),
                         "dispatch_layout: source_rank has {} tokens, exec_rank {}",
                         source_rank.shape(0), exec_rank.shape(0));
        const int top_k = static_cast<int>(exec_rank.shape(1));
        COBALT_CHECK_ARG(top_k >= 1, "dispatch_layout: exec_rank needs K >= 1 columns");
        assign::DispatchLayout d;
        {
          py::gil_scoped_release release;
          d = assign::dispatch_layout(span_of(exec_rank), span_of(source_rank), top_k, topology);
        }
        const py::ssize_t t = exec_rank.shape(0), k = top_k, g = topology.num_ranks(),
                          n = topology.num_nodes();
        py::dict out;
        out["rank_counts"] = owned_array(std::move(d.rank_counts), {g});
        out["node_counts"] = owned_array(std::move(d.node_counts), {n});
        out["rank_offsets"] = owned_array(std::move(d.rank_offsets), {g + 1});
        out["pair_counts"] = owned_array(std::move(d.pair_counts), {g, g});
        out["token_in_rank"] = owned_array(std::move(d.token_in_rank), {t, g});
        out["slot"] = owned_array(std::move(d.slot), {t, k});
        return out;
      },
      py::arg("exec_rank"), py::arg("source_rank"), py::arg("topology"),
      "Dispatch layout of an assignment (include/cobalt/assign/dispatch_layout.hpp): a dict of "
      "rank_counts [G], node_counts [N], rank_offsets [G + 1], pair_counts [G, G] (int64), "
      "token_in_rank [T, G] (uint8) and slot [T, K] (int32).");
}

}  // namespace cobalt::py_bindings
