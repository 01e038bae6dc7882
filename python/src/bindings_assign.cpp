// assign/: Cobalt Algorithm 1 (minimum remote-node set cover per token).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/stl.h>

#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings_common.hpp"
#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "py_routing_batch.hpp"

namespace cobalt::py_bindings {
namespace {

// assign::BalancedCoverWorkspace kept across calls from Python; one call at a time (the GIL is
// released while it runs, and the workspace is not for concurrent calls).
struct PyBalancedCoverWorkspace {
  assign::BalancedCoverWorkspace scratch;
  std::mutex mutex;
};

// `out` when given (a writeable C-contiguous int32 numpy array of shape [T, K] or [T * K]: it is
// written in place, never copied, so anything else is refused naming what is wrong), else a new
// [T, K] array.
py::array_t<int32_t, py::array::c_style> exec_output(const PyRoutingBatch& b,
                                                     const std::optional<py::object>& out,
                                                     const char* what) {
  const auto num_tokens = static_cast<py::ssize_t>(b.batch.num_tokens());
  const auto top_k = static_cast<py::ssize_t>(b.batch.top_k());
  if (!out.has_value() || out->is_none()) return py::array_t<int32_t>({num_tokens, top_k});
  if (!py::isinstance<py::array>(*out)) {
    throw py::type_error(fmt::format("{}: out must be a numpy int32 array, got {}", what,
                                     std::string(py::str(py::type::of(*out).attr("__name__")))));
  }
  const auto array = py::reinterpret_borrow<py::array>(*out);
  // By value, not dtype identity (an equal native int32 dtype may be another object).
  const py::object dtype = array.dtype();
  const bool int32 = py::cast<std::string>(dtype.attr("kind")) == "i" &&
                     py::cast<int>(dtype.attr("itemsize")) == 4 &&
                     py::cast<bool>(dtype.attr("isnative"));
  if (!int32) {
    throw py::type_error(fmt::format("{}: out must be an int32 array, got dtype {}", what,
                                     std::string(py::str(array.dtype()))));
  }
  const bool shaped =
      (array.ndim() == 2 && array.shape(0) == num_tokens && array.shape(1) == top_k) ||
      (array.ndim() == 1 && array.shape(0) == num_tokens * top_k);
  std::vector<py::ssize_t> shape(array.shape(), array.shape() + array.ndim());
  COBALT_CHECK_ARG(shaped, "{}: out has shape [{}], the batch needs [{}, {}] (or [{}])", what,
                   fmt::join(shape, ", "), num_tokens, top_k, num_tokens * top_k);
  if ((array.flags() & py::array::c_style) == 0) {
    throw py::type_error(
        fmt::format("{}: out must be C-contiguous (it is written in place)", what));
  }
  COBALT_CHECK_ARG(array.writeable(), "{}: out is read-only", what);
  return py::reinterpret_borrow<py::array_t<int32_t, py::array::c_style>>(*out);
}

}  // namespace

void bind_assign(py::module_& m) {
  py::enum_<assign::CoverSearch>(m, "CoverSearch")
      .value("MASK_ENUMERATION", assign::CoverSearch::kMaskEnumeration)
      .value("SUBSET_DP", assign::CoverSearch::kSubsetDp)
      .value("AUTO", assign::CoverSearch::kAuto);
  py::enum_<assign::CpuKernel>(m, "CpuKernel")
      .value("AUTO", assign::CpuKernel::kAuto)
      .value("PORTABLE", assign::CpuKernel::kPortable)
      .value("AVX512", assign::CpuKernel::kAvx512);
  m.def("avx512_kernel_available", &assign::avx512_kernel_available,
        "True when this build and CPU run the AVX-512 assignment kernel (AVX-512 F/DQ/VL/BW).");

  m.def(
      "assign_node_cover",
      [](const PyRoutingBatch& b, const ExpertLayout& layout, PyInt seed_in, PyInt step_in,
         PyInt layer_in, PyInt token_offset_in, assign::CoverSearch search, PyInt num_threads_in,
         std::optional<py::object> out, assign::CpuKernel kernel) {
        const uint64_t seed = uint64_arg(seed_in, "seed");
        const int64_t step = int64_arg(step_in, "step");
        const int layer = int_arg(layer_in, "layer");
        const int64_t token_offset = int64_arg(token_offset_in, "token_offset");
        const int num_threads = int_arg(num_threads_in, "num_threads");
        py::array_t<int32_t, py::array::c_style> exec = exec_output(b, out, "assign_node_cover");
        std::span<RankId> dst(exec.mutable_data(), static_cast<size_t>(b.batch.num_tasks()));
        {
          py::gil_scoped_release release;
          assign::assign_node_cover(b.batch, layout, {seed, step, layer, token_offset},
                                    {search, num_threads, kernel}, dst);
        }
        return exec;
      },
      py::arg("batch"), py::arg("layout"), py::arg("seed") = 0, py::arg("step") = 0,
      py::arg("layer") = 0, py::arg("token_offset") = 0,
      py::arg("search") = assign::CoverSearch::kAuto, py::arg("num_threads") = 1,
      py::arg("out") = py::none(), py::arg("kernel") = assign::CpuKernel::kAuto,
      "Cobalt Algorithm 1: execution rank of every task, [T, K] int32 (written into `out` when "
      "given). Draws are keyed by (seed, step, layer, token_offset + t, k); every kernel writes "
      "the same ranks.");
  py::class_<PyBalancedCoverWorkspace>(m, "BalancedCoverWorkspace")
      .def(py::init<>(),
           "Scratch memory of assign_balanced_cover(..., workspace=) kept across calls (a word "
           "per token and one per task, and the spill's per-replica task lists and search "
           "state, grown to the largest batch and layout seen): a caller assigning every step "
           "allocates and page-faults none of it again. One call at a time.")
      .def_property_readonly(
          "capacity_bytes",
          [](PyBalancedCoverWorkspace& w) {
            py::gil_scoped_release release;  // a call may hold the lock with the GIL released
            std::lock_guard lock(w.mutex);
            return w.scratch.capacity_bytes();
          },
          "Bytes held.");

  m.def(
      "assign_balanced_cover",
      [](const PyRoutingBatch& b, const ExpertLayout& layout, double spill_tolerance,
         assign::CoverSearch search, PyInt num_threads_in, std::optional<py::object> out,
         PyBalancedCoverWorkspace* kept, PyInt seed_in, PyInt step_in, PyInt layer_in,
         PyInt token_offset_in) {
        const int num_threads = int_arg(num_threads_in, "num_threads");
        const assign::AssignKey key{uint64_arg(seed_in, "seed"), int64_arg(step_in, "step"),
                                    int_arg(layer_in, "layer"),
                                    int64_arg(token_offset_in, "token_offset")};
        COBALT_CHECK_ARG(std::isfinite(spill_tolerance),
                         "assign_balanced_cover: spill_tolerance {} must be finite (< 0: no spill)",
                         spill_tolerance);
        py::array_t<int32_t, py::array::c_style> exec =
            exec_output(b, out, "assign_balanced_cover");
        std::span<RankId> dst(exec.mutable_data(), static_cast<size_t>(b.batch.num_tasks()));
        {
          py::gil_scoped_release release;
          std::unique_lock<std::mutex> lock;
          if (kept != nullptr) lock = std::unique_lock(kept->mutex);
          assign::assign_balanced_cover(b.batch, layout, key, {search, num_threads}, dst,
                                        spill_tolerance, kept ? &kept->scratch : nullptr);
        }
        return exec;
      },
      py::arg("batch"), py::arg("layout"), py::arg("spill_tolerance") = -1.0,
      py::arg("search") = assign::CoverSearch::kAuto, py::arg("num_threads") = 1,
      py::arg("out") = py::none(), py::arg("workspace") = py::none(), py::arg("seed") = 0,
      py::arg("step") = 0, py::arg("layer") = 0, py::arg("token_offset") = 0,
      "cobalt+'s assignment: Algorithm 1's covers with ranks chosen to balance load, [T, K] int32 "
      "(the same cross-node transfers as assign_node_cover; seed, step, layer and token_offset "
      "key the draw between tied minimum covers, as there). spill_tolerance >= 0 (cobalt+ uses "
      "0.05) then moves tasks along chains of holders, adding cross-node copies where needed, "
      "until the busiest rank is within the largest whole load <= (1 + tolerance) x mean "
      "(balance_cap) or at the layout's floor. `out`: written into when given; `workspace`: a "
      "BalancedCoverWorkspace kept across calls (the ranks do not depend on it).");
  m.def(
      "min_remote_cover_size",
      [](InArray<int32_t> experts, NodeId src_node, const ExpertLayout& layout) {
        for (auto e : span_of(experts)) {
          COBALT_CHECK_ARG(e >= 0 && e < layout.num_experts(), "expert {} out of range [0, {})", e,
                           layout.num_experts());
        }
        COBALT_CHECK_ARG(src_node >= 0 && src_node < layout.num_nodes(),
                         "node {} out of range [0, {})", src_node, layout.num_nodes());
        return assign::min_remote_cover_size(span_of(experts), src_node, layout);
      },
      py::arg("experts"), py::arg("src_node"), py::arg("layout"));
}

}  // namespace cobalt::py_bindings
