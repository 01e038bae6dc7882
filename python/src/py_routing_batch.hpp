// The Python-side RoutingBatch: owns read-only copies of the int32 arrays the C++ view points at,
// so the view can never outlive its data and nobody can change validated ids under it.
#pragma once

#include <optional>

#include "bindings_common.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::py_bindings {

struct PyRoutingBatch {
  InArray<int32_t> topk_ids;     // [T, K]
  InArray<int32_t> source_rank;  // [T]
  RoutingBatch batch;

  // topk_ids: [T, K]; source_rank: [T] or None (contiguous blocks per rank). Both are taken as
  // IntArray<int32_t>::from takes them (int64 narrowed, out-of-range values refused), then
  // validated as RoutingBatch's constructor validates (there is no unchecked form in Python: the
  // kernels index by these ids).
  static PyRoutingBatch make(py::object topk_ids, std::optional<py::object> source_rank,
                             PyInt num_experts, PyInt num_ranks);
};

}  // namespace cobalt::py_bindings
