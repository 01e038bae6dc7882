// assign/dispatch_layout: what a DeepEP-style exchange needs from an assignment (the CPU reference
// of the CUDA dispatch-layout kernel), into fresh arrays or into a kept DispatchLayoutWorkspace;
// assign/exchange_plan: one rank's node-deduplicated two-stage exchange (cobalt.torch's runtime).
#include <mutex>

#include "bindings_common.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/assign/exchange_plan.hpp"
#include "cobalt/core/memory.hpp"

namespace cobalt::py_bindings {
namespace {

// Buffers sized once for up to max_tokens tokens of up to max_top_k tasks on one topology, so a
// runtime that calls dispatch_layout every step allocates nothing of the batch's size. The
// vectors never grow past their first capacity (calls beyond the sizes are refused), so numpy
// views of them stay valid; each call overwrites them.
struct DispatchWorkspace {
  DispatchWorkspace(const Topology& topo, int64_t tokens, int top_k)
      : topology(topo), max_tokens(tokens), max_top_k(top_k) {
    COBALT_CHECK_ARG(tokens >= 0 && tokens <= (int64_t{1} << 31),
                     "dispatch workspace: max_tokens {} out of range [0, 2^31]", tokens);
    COBALT_CHECK_ARG(top_k >= 1 && top_k <= 1024,
                     "dispatch workspace: max_top_k {} out of range [1, 1024]", top_k);
    const auto g = static_cast<size_t>(topo.num_ranks());
    // The [T, G] flags and [T, K] slots dominate (a bare std::bad_alloc MemoryError before).
    const double t = static_cast<double>(tokens), gd = static_cast<double>(g);
    require_memory(
        t * gd + 4.0 * t * top_k + 8.0 * gd * gd,
        fmt::format("dispatch workspace: {} tokens x {} ranks (top-k {})", tokens, g, top_k),
        "size it for the largest batch a step has, not more");
    layout.rank_counts.reserve(g);
    layout.node_counts.reserve(static_cast<size_t>(topo.num_nodes()));
    layout.rank_offsets.reserve(g + 1);
    layout.pair_counts.reserve(g * g);
    layout.token_in_rank.reserve(static_cast<size_t>(tokens) * g);
    layout.slot.reserve(static_cast<size_t>(tokens) * static_cast<size_t>(top_k));
  }
  Topology topology;
  int64_t max_tokens;
  int max_top_k;
  assign::DispatchLayout layout;
  std::mutex mutex;  // one call at a time (calls hold the GIL, so this only guards C++ misuse)
};

py::dict layout_dict(const assign::DispatchLayout& d, py::ssize_t t, py::ssize_t k,
                     const Topology& topology, py::handle owner) {
  const py::ssize_t g = topology.num_ranks(), n = topology.num_nodes();
  py::dict out;
  out["rank_counts"] = view_of(std::span<const int64_t>(d.rank_counts), {g}, owner);
  out["node_counts"] = view_of(std::span<const int64_t>(d.node_counts), {n}, owner);
  out["rank_offsets"] = view_of(std::span<const int64_t>(d.rank_offsets), {g + 1}, owner);
  out["pair_counts"] = view_of(std::span<const int64_t>(d.pair_counts), {g, g}, owner);
  out["token_in_rank"] = view_of(std::span<const uint8_t>(d.token_in_rank), {t, g}, owner);
  out["slot"] = view_of(std::span<const int32_t>(d.slot), {t, k}, owner);
  return out;
}

}  // namespace

void bind_dispatch(py::module_& m) {
  py::class_<DispatchWorkspace>(m, "DispatchLayoutWorkspace")
      .def(py::init([](const Topology& topology, PyInt max_tokens, PyInt max_top_k) {
             return std::make_unique<DispatchWorkspace>(
                 topology, int64_arg(max_tokens, "max_tokens"), int_arg(max_top_k, "max_top_k"));
           }),
           py::arg("topology"), py::arg("max_tokens"), py::arg("max_top_k"),
           "Buffers for dispatch_layout(..., workspace=) on `topology`, sized once for batches "
           "of up to max_tokens tokens of up to max_top_k tasks.")
      .def_readonly("topology", &DispatchWorkspace::topology)
      .def_readonly("max_tokens", &DispatchWorkspace::max_tokens)
      .def_readonly("max_top_k", &DispatchWorkspace::max_top_k);

  m.def(
      "dispatch_layout",
      [](const py::object& exec_rank_in, const py::object& source_rank_in, const Topology& topology,
         const py::object& workspace) {
        // Converted here rather than by the caster so that errors name the argument.
        const IntArray<int32_t> exec_rank =
            int_array<int32_t>(exec_rank_in, "dispatch_layout exec_rank");
        const IntArray<int32_t> source_rank =
            int_array<int32_t>(source_rank_in, "dispatch_layout source_rank");
        require_ndim(exec_rank, 2, "dispatch_layout exec_rank [T, K]");
        require_ndim(source_rank, 1, "dispatch_layout source_rank [T]");
        COBALT_CHECK_ARG(source_rank.shape(0) == exec_rank.shape(0),
                         "dispatch_layout: source_rank has {} tokens, exec_rank {}",
                         source_rank.shape(0), exec_rank.shape(0));
        const int top_k = static_cast<int>(exec_rank.shape(1));
        COBALT_CHECK_ARG(top_k >= 1, "dispatch_layout: exec_rank needs K >= 1 columns");
        const py::ssize_t t = exec_rank.shape(0), k = top_k;
        if (!workspace.is_none()) {
          if (!py::isinstance<DispatchWorkspace>(workspace)) {
            throw py::type_error(
                fmt::format("dispatch_layout: workspace must be a DispatchLayoutWorkspace, got {}",
                            std::string(py::str(py::type::of(workspace).attr("__name__")))));
          }
          auto& ws = workspace.cast<DispatchWorkspace&>();
          COBALT_CHECK_ARG(ws.topology == topology,
                           "dispatch_layout: the workspace is for {}, the call for {}",
                           ws.topology.to_string(), topology.to_string());
          COBALT_CHECK_ARG(t <= ws.max_tokens && top_k <= ws.max_top_k,
                           "dispatch_layout: {} tokens x top-{} exceed the workspace's {} x {}", t,
                           top_k, ws.max_tokens, ws.max_top_k);
          const void* slot_data = ws.layout.slot.data();
          const void* flag_data = ws.layout.token_in_rank.data();
          {
            // The GIL stays held (here and below): the call checks the caller's arrays and then
            // indexes with their values, so no Python thread may change them meanwhile (native
            // code writing them from another thread, e.g. a torch op on shared memory, still must
            // not: that is the caller's contract), and the views returned must describe this
            // call's result. O(T K): milliseconds; copying the inputs would cost as much again.
            std::lock_guard lock(ws.mutex);
            assign::dispatch_layout(span_of(exec_rank), span_of(source_rank), top_k, topology,
                                    ws.layout);
          }
          COBALT_CHECK_INTERNAL(
              ws.layout.slot.data() == slot_data && ws.layout.token_in_rank.data() == flag_data,
              "dispatch_layout: the workspace's buffers moved");
          return layout_dict(ws.layout, t, k, topology, workspace);
        }
        assign::DispatchLayout d =
            assign::dispatch_layout(span_of(exec_rank), span_of(source_rank), top_k, topology);
        const py::ssize_t g = topology.num_ranks(), n = topology.num_nodes();
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
      py::arg("workspace") = py::none(),
      "Dispatch layout of an assignment (include/cobalt/assign/dispatch_layout.hpp): a dict of "
      "rank_counts [G], node_counts [N], rank_offsets [G + 1], pair_counts [G, G] (int64), "
      "token_in_rank [T, G] (uint8) and slot [T, K] (int32). Fresh writable arrays by default; "
      "with a DispatchLayoutWorkspace, read-only views of its buffers that the next call with it "
      "overwrites (nothing of the batch's size is allocated).");

  m.def(
      "exchange_plan",
      [](InArray<int32_t> topk_ids, InArray<int32_t> exec_rank, InArray<int32_t> source_rank,
         const Topology& topology, InArray<int32_t> rank_slots, PyInt rank_in) {
        const int rank = int_arg(rank_in, "rank");
        require_ndim(topk_ids, 2, "exchange_plan topk_ids [T, K]");
        require_ndim(exec_rank, 2, "exchange_plan exec_rank [T, K]");
        require_ndim(source_rank, 1, "exchange_plan source_rank [T]");
        require_ndim(rank_slots, 1, "exchange_plan rank_slots [S]");
        COBALT_CHECK_ARG(topk_ids.shape(0) == exec_rank.shape(0) &&
                             topk_ids.shape(1) == exec_rank.shape(1) &&
                             source_rank.shape(0) == exec_rank.shape(0),
                         "exchange_plan: topk_ids {}x{}, exec_rank {}x{} and source_rank [{}] "
                         "disagree",
                         topk_ids.shape(0), topk_ids.shape(1), exec_rank.shape(0),
                         exec_rank.shape(1), source_rank.shape(0));
        const int top_k = static_cast<int>(exec_rank.shape(1));
        // With the GIL held, as dispatch_layout: the arrays are indexed with values checked first.
        assign::RankExchangePlan plan =
            assign::exchange_plan(span_of(topk_ids), span_of(exec_rank), span_of(source_rank),
                                  top_k, topology, span_of(rank_slots), rank);
        py::dict out;
        const auto put = [&](const char* name, std::vector<int64_t>& v) {
          const auto n = static_cast<py::ssize_t>(v.size());
          out[name] = owned_array(std::move(v), {n});
        };
        out["num_local_tokens"] = plan.num_local_tokens;
        put("s1_send_idx", plan.s1_send_idx);
        put("s1_send_splits", plan.s1_send_splits);
        put("s1_recv_splits", plan.s1_recv_splits);
        put("s2_send_idx", plan.s2_send_idx);
        put("s2_send_splits", plan.s2_send_splits);
        put("s2_recv_splits", plan.s2_recv_splits);
        put("table_idx", plan.table_idx);
        put("slot_offsets", plan.slot_offsets);
        put("slot_rows", plan.slot_rows);
        put("slot_k", plan.slot_k);
        put("ca_send_idx", plan.ca_send_idx);
        put("ca_send_splits", plan.ca_send_splits);
        put("ca_recv_splits", plan.ca_recv_splits);
        put("q_own_dst", plan.q_own_dst);
        put("q_own_src", plan.q_own_src);
        put("q_recv_dst", plan.q_recv_dst);
        put("q_recv_src", plan.q_recv_src);
        put("cb_send_splits", plan.cb_send_splits);
        put("cb_recv_splits", plan.cb_recv_splits);
        put("y_own_dst", plan.y_own_dst);
        put("y_own_src", plan.y_own_src);
        put("y_recv_a_dst", plan.y_recv_a_dst);
        put("y_recv_a_src", plan.y_recv_a_src);
        put("y_recv_b_dst", plan.y_recv_b_dst);
        out["num_deliveries"] = plan.num_deliveries;
        out["num_cross_rows"] = plan.num_cross_rows;
        out["num_intra_rows"] = plan.num_intra_rows;
        out["num_stage1_rows"] = plan.num_stage1_rows;
        return out;
      },
      py::arg("topk_ids"), py::arg("exec_rank"), py::arg("source_rank"), py::arg("topology"),
      py::arg("rank_slots"), py::arg("rank"),
      "One rank's node-deduplicated dispatch/combine plan (include/cobalt/assign/"
      "exchange_plan.hpp): a dict of int64 index arrays and per-peer splits, as "
      "cobalt.torch.exchange_plan.build_exchange_plan returns them (slot tasks as CSR: "
      "slot_offsets [S + 1], slot_rows, slot_k), and whole-step counts.");
}

}  // namespace cobalt::py_bindings
