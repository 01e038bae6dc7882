// cobalt._cuda: the CUDA kernels of include/cobalt/cuda/ at the pointer level (built only when
// nvcc is found; docs/gpu.md). Device pointers and streams are plain integers (a torch tensor's
// data_ptr(), torch.cuda.current_stream().cuda_stream); the torch-facing wrappers that check
// devices, dtypes and shapes and allocate outputs and workspaces are in python/cobalt/cuda.py.
// Nothing here synchronises the host except DeviceLayout's upload and release (cudaFree); kernel
// launches release the GIL.
// cobalt::Error raises the exceptions of cobalt._core (InvalidArgumentError, ...).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/cuda/assign.hpp"
#include "cobalt/cuda/device_layout.hpp"
#include "cobalt/cuda/dispatch_layout.hpp"
#include "cobalt/cuda/routing_stats.hpp"
#include "cobalt/cuda/topoep.hpp"

namespace py = pybind11;

namespace cobalt::cuda {
namespace {

using Ptr = std::uintptr_t;  // a device address (0 = none)

template <typename T>
T* as(Ptr p) {
  return reinterpret_cast<T*>(p);
}
Stream as_stream(Ptr p) { return reinterpret_cast<Stream>(p); }

// cobalt::Error -> the exception classes of cobalt._core, so `except cobalt.InvalidArgumentError`
// works for both modules. Module-local: a global translator registered after _core's would be
// tried first for _core's exceptions too, and turn its IoError (an OSError) into a plain
// InvalidArgumentError once this module is imported.
void register_errors() {
  py::module_ core = py::module_::import("cobalt._core");
  static PyObject* invalid_argument = py::object(core.attr("InvalidArgumentError")).release().ptr();
  static PyObject* failed_precondition =
      py::object(core.attr("FailedPreconditionError")).release().ptr();
  static PyObject* internal = py::object(core.attr("InternalError")).release().ptr();
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = internal;
      if (e.code() == ErrorCode::kInvalidArgument) type = invalid_argument;
      if (e.code() == ErrorCode::kFailedPrecondition) type = failed_precondition;
      PyErr_SetString(type, e.what());
    }
  });
}

assign::CoverSearch parse_search(const std::string& name) {
  if (name == "auto") return assign::CoverSearch::kAuto;
  if (name == "masks") return assign::CoverSearch::kMaskEnumeration;
  if (name == "subset_dp") return assign::CoverSearch::kSubsetDp;
  fail(ErrorCode::kInvalidArgument, "unknown cover search '{}' (valid: auto, masks, subset_dp)",
       printable(name));
}

StatsMethod parse_method(const std::string& name) {
  if (name == "auto") return StatsMethod::kAuto;
  if (name == "shared") return StatsMethod::kSharedAggregated;
  if (name == "shared_plain") return StatsMethod::kSharedPlain;
  if (name == "global") return StatsMethod::kGlobalAggregated;
  fail(ErrorCode::kInvalidArgument,
       "unknown statistics method '{}' (valid: auto, shared, shared_plain, global)",
       printable(name));
}

TopoEpDeviceInput topoep_input(int num_nodes, int num_ranks, int num_experts, int slots_per_rank,
                               double token_bytes, double expert_param_bytes, Ptr demand,
                               int max_moves_per_node) {
  TopoEpDeviceInput in;
  in.num_nodes = num_nodes;
  in.num_ranks = num_ranks;
  in.num_experts = num_experts;
  in.slots_per_rank = slots_per_rank;
  in.token_bytes = token_bytes;
  in.expert_param_bytes = expert_param_bytes;
  in.demand = as<const int64_t>(demand);
  in.max_moves_per_node = max_moves_per_node;
  return in;
}

}  // namespace
}  // namespace cobalt::cuda

PYBIND11_MODULE(_cuda, m) {
  using namespace cobalt;
  using namespace cobalt::cuda;
  m.doc() = "Cobalt CUDA kernels at the pointer level (use cobalt.cuda for torch tensors).";
  register_errors();
  const auto release_gil = py::call_guard<py::gil_scoped_release>();

  m.def("device_available", &device_available,
        "Whether the CUDA runtime sees a device (False without a driver or GPU; never raises).");

  py::class_<DeviceLayout>(m, "DeviceLayout",
                           "An expert layout's lookup maps in device memory (uploaded once per "
                           "layout change; the upload synchronises the stream).")
      .def(py::init([](int num_nodes, int num_ranks, int num_experts,
                       py::array_t<int32_t, py::array::c_style | py::array::forcecast> slots,
                       Ptr stream) {
             COBALT_CHECK_ARG(slots.ndim() == 2 && slots.shape(0) == num_ranks,
                              "DeviceLayout: slots must be [G={}, S], got {} dimension(s)",
                              num_ranks, slots.ndim());
             const int slots_per_rank = static_cast<int>(slots.shape(1));
             const ExpertLayout layout(
                 Topology(num_nodes, num_ranks), num_experts, slots_per_rank,
                 std::vector<ExpertId>(slots.data(), slots.data() + slots.size()));
             py::gil_scoped_release release;
             return DeviceLayout(layout, as_stream(stream));
           }),
           py::arg("num_nodes"), py::arg("num_ranks"), py::arg("num_experts"), py::arg("slots"),
           py::arg("stream") = 0)
      .def_property_readonly("num_experts",
                             [](const DeviceLayout& l) { return l.view().num_experts; })
      .def_property_readonly("num_nodes", [](const DeviceLayout& l) { return l.view().num_nodes; })
      .def_property_readonly("num_ranks", [](const DeviceLayout& l) { return l.view().num_ranks; });

  m.def(
      "assign_workspace_bytes",
      [](int64_t num_tokens, int top_k, int num_nodes, const std::string& search) {
        return assign_workspace_bytes(num_tokens, top_k, num_nodes, parse_search(search));
      },
      py::arg("num_tokens"), py::arg("top_k"), py::arg("num_nodes"), py::arg("search"));
  m.def(
      "assign_node_cover",
      [](const DeviceLayout& layout, Ptr topk_ids, Ptr source_rank, int64_t num_tokens, int top_k,
         uint64_t seed, int64_t step, int layer, int64_t token_offset, const std::string& search,
         Ptr exec_rank, Ptr workspace, size_t workspace_bytes, Ptr stream) {
        assign_node_cover(
            layout.view(), as<const int32_t>(topk_ids), as<const int32_t>(source_rank), num_tokens,
            top_k, {seed, step, layer, token_offset}, parse_search(search), as<int32_t>(exec_rank),
            as<void>(workspace), workspace_bytes, as_stream(stream));
      },
      py::arg("layout"), py::arg("topk_ids"), py::arg("source_rank"), py::arg("num_tokens"),
      py::arg("top_k"), py::arg("seed"), py::arg("step"), py::arg("layer"), py::arg("token_offset"),
      py::arg("search"), py::arg("exec_rank"), py::arg("workspace"), py::arg("workspace_bytes"),
      py::arg("stream"), release_gil);

  m.def(
      "routing_counts_supported",
      [](int num_experts, const std::string& method) {
        return routing_counts_supported(num_experts, parse_method(method));
      },
      py::arg("num_experts"), py::arg("method"));
  m.def(
      "routing_counts_workspace_bytes",
      [](int64_t num_tokens, int top_k, int num_experts, const std::string& method) {
        return routing_counts_workspace_bytes(num_tokens, top_k, num_experts, parse_method(method));
      },
      py::arg("num_tokens"), py::arg("top_k"), py::arg("num_experts"), py::arg("method"));
  m.def(
      "count_routing",
      [](Ptr topk_ids, int64_t num_tokens, int top_k, int num_experts, Ptr expert_counts,
         Ptr coactivation, Ptr workspace, size_t workspace_bytes, Ptr stream,
         const std::string& method) {
        count_routing(as<const int32_t>(topk_ids), num_tokens, top_k, num_experts,
                      as<int64_t>(expert_counts), as<int64_t>(coactivation), as<void>(workspace),
                      workspace_bytes, as_stream(stream), parse_method(method));
      },
      py::arg("topk_ids"), py::arg("num_tokens"), py::arg("top_k"), py::arg("num_experts"),
      py::arg("expert_counts"), py::arg("coactivation"), py::arg("workspace"),
      py::arg("workspace_bytes"), py::arg("stream"), py::arg("method"), release_gil);

  m.def("dispatch_layout_workspace_bytes", &dispatch_layout_workspace_bytes, py::arg("num_tokens"),
        py::arg("num_ranks"));
  m.def(
      "dispatch_layout",
      [](Ptr exec_rank, Ptr source_rank, int64_t num_tokens, int top_k, int num_nodes,
         int num_ranks, Ptr rank_counts, Ptr node_counts, Ptr rank_offsets, Ptr slot,
         Ptr token_in_rank, Ptr pair_counts, Ptr workspace, size_t workspace_bytes, Ptr stream) {
        DispatchLayoutOutputs out;
        out.rank_counts = as<int64_t>(rank_counts);
        out.node_counts = as<int64_t>(node_counts);
        out.rank_offsets = as<int64_t>(rank_offsets);
        out.slot = as<int32_t>(slot);
        out.token_in_rank = as<uint8_t>(token_in_rank);
        out.pair_counts = as<int64_t>(pair_counts);
        dispatch_layout(as<const int32_t>(exec_rank), as<const int32_t>(source_rank), num_tokens,
                        top_k, num_nodes, num_ranks, out, as<void>(workspace), workspace_bytes,
                        as_stream(stream));
      },
      py::arg("exec_rank"), py::arg("source_rank"), py::arg("num_tokens"), py::arg("top_k"),
      py::arg("num_nodes"), py::arg("num_ranks"), py::arg("rank_counts"), py::arg("node_counts"),
      py::arg("rank_offsets"), py::arg("slot"), py::arg("token_in_rank"), py::arg("pair_counts"),
      py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream"), release_gil);

  m.def("topoep_quota_capacity", &topoep_quota_capacity, py::arg("num_ranks"),
        py::arg("slots_per_rank"));
  m.def(
      "topoep_workspace_bytes",
      [](int num_nodes, int num_ranks, int num_experts, int slots_per_rank,
         int max_moves_per_node) {
        return topoep_workspace_bytes(topoep_input(num_nodes, num_ranks, num_experts,
                                                   slots_per_rank, 0, 0, 0, max_moves_per_node));
      },
      py::arg("num_nodes"), py::arg("num_ranks"), py::arg("num_experts"), py::arg("slots_per_rank"),
      py::arg("max_moves_per_node"));
  m.def(
      "solve_topoep",
      [](int num_nodes, int num_ranks, int num_experts, int slots_per_rank, double token_bytes,
         double expert_param_bytes, Ptr demand, int max_moves_per_node, Ptr slots,
         Ptr source_offsets, Ptr quotas, int64_t quota_capacity, Ptr rank_loads, Ptr stats,
         Ptr status, Ptr workspace, size_t workspace_bytes, Ptr stream) {
        TopoEpDeviceOutput out;
        out.slots = as<int32_t>(slots);
        out.source_offsets = as<int64_t>(source_offsets);
        out.quotas = as<TopoEpDeviceQuota>(quotas);
        out.quota_capacity = quota_capacity;
        out.rank_loads = as<int64_t>(rank_loads);
        out.stats = as<int64_t>(stats);
        out.status = as<int32_t>(status);
        solve_topoep(topoep_input(num_nodes, num_ranks, num_experts, slots_per_rank, token_bytes,
                                  expert_param_bytes, demand, max_moves_per_node),
                     out, as<void>(workspace), workspace_bytes, as_stream(stream));
      },
      py::arg("num_nodes"), py::arg("num_ranks"), py::arg("num_experts"), py::arg("slots_per_rank"),
      py::arg("token_bytes"), py::arg("expert_param_bytes"), py::arg("demand"),
      py::arg("max_moves_per_node"), py::arg("slots"), py::arg("source_offsets"), py::arg("quotas"),
      py::arg("quota_capacity"), py::arg("rank_loads"), py::arg("stats"), py::arg("status"),
      py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream"), release_gil);
}
