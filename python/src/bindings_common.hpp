// Shared helpers of the cobalt._core bindings: numpy views of C++ memory (zero-copy, read-only,
// kept alive by their owner), input arrays (zero-copy when the dtype and layout already match,
// which includes torch CPU tensors through their __array__), and the per-area bind functions.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt::py_bindings {

namespace py = pybind11;

// Input array of T, C-contiguous; converts (copies) only when the source is not already that.
template <typename T>
using InArray = py::array_t<T, py::array::c_style | py::array::forcecast>;

// Strides (in bytes) of a C-contiguous array of `shape`.
template <typename T>
std::vector<py::ssize_t> c_strides(const std::vector<py::ssize_t>& shape) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t step = sizeof(T);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return strides;
}

inline void mark_readonly(py::array& array) {
  reinterpret_cast<py::detail::PyArray_Proxy*>(array.ptr())->flags &=
      ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
}

// A read-only numpy view of `data` with `shape`, kept alive by `owner` (no copy). Empty data gives
// an empty owned array.
template <typename T>
py::array view_of(std::span<const T> data, std::vector<py::ssize_t> shape, py::handle owner) {
  py::ssize_t total = 1;
  for (auto d : shape) total *= d;
  COBALT_CHECK_INTERNAL(static_cast<size_t>(total) == data.size(),
                        "bindings: view of {} elements with a shape of {} elements", data.size(),
                        total);
  if (data.empty()) return py::array_t<T>(shape);
  py::array out(py::dtype::of<T>(), shape, c_strides<T>(shape), data.data(), owner);
  mark_readonly(out);
  return out;
}

// A numpy array that takes ownership of `values` (no copy of the elements).
template <typename T>
py::array owned_array(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  py::capsule free_when_done(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array(py::dtype::of<T>(), shape, c_strides<T>(shape), heap->data(), free_when_done);
}

// Requires `array` to have `ndim` dimensions; names `what` in the ValueError otherwise.
inline void require_ndim(const py::array& array, int ndim, const char* what) {
  COBALT_CHECK_ARG(array.ndim() == ndim, "{}: expected a {}-d array, got {} dimension(s)", what,
                   ndim, array.ndim());
}

template <typename T>
std::span<const T> span_of(const InArray<T>& array) {
  return std::span<const T>(array.data(), static_cast<size_t>(array.size()));
}

template <typename T>
std::vector<T> vector_of(const InArray<T>& array) {
  return std::vector<T>(array.data(), array.data() + array.size());
}

void bind_errors(py::module_& m);
void bind_core(py::module_& m);
void bind_stats(py::module_& m);
void bind_plan(py::module_& m);
void bind_assign(py::module_& m);
void bind_policy(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_topoep(py::module_& m);
void bind_cost(py::module_& m);
void bind_eval(py::module_& m);
void bind_io(py::module_& m);

}  // namespace cobalt::py_bindings
