// Shared helpers of the cobalt._core bindings: numpy views of C++ memory (zero-copy, read-only,
// kept alive by their owner), input arrays (zero-copy when the dtype and layout already match,
// which includes torch CPU tensors through their __array__), and the per-area bind functions.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"

namespace cobalt::py_bindings {

namespace py = pybind11;

// "int32 array of shape (2147483648, 2)": an array for messages.
inline std::string describe_array(const py::array& array) {
  return fmt::format("{} array of shape {}", std::string(py::str(array.dtype())),
                     std::string(py::str(array.attr("shape"))));
}

// Before ensure() copies `array` into a new C-contiguous array of T (it is strided, broadcast or
// of another dtype): a copy past the memory budget is refused by its size. numpy's failed
// allocation made ensure() return null, read as a dtype error, and np.broadcast_to makes arrays of
// 2^31 rows that take no memory.
template <typename T>
void require_copy_memory(const py::array& array) {
  if (py::array_t<T, py::array::c_style>::check_(array)) return;  // used as it is
  require_memory(static_cast<double>(array.size()) * sizeof(T),
                 fmt::format("a C-contiguous copy of the {} (strided, broadcast or another dtype)",
                             describe_array(array)));
}

// Input array of floating T, C-contiguous; converts (copies) only when the source is not already
// that. Only real numbers convert: a bool, complex, string or object array is a ValueError (a
// plain forcecast read '1' as 1.0 and dropped imaginary parts); see the type_caster below.
template <typename T>
class FloatArray : public py::array_t<T, py::array::c_style | py::array::forcecast> {
  using Base = py::array_t<T, py::array::c_style | py::array::forcecast>;

 public:
  using Base::Base;
  FloatArray() : Base() {}
  explicit FloatArray(Base&& base) : Base(std::move(base)) {}

  static FloatArray from(py::handle src) {
    const bool given_array = py::isinstance<py::array>(src);
    py::array array = given_array ? py::reinterpret_borrow<py::array>(src)
                                  : py::array(py::module_::import("numpy").attr("asarray")(src));
    if (array.size() > 0) {
      const char kind = array.dtype().kind();
      COBALT_CHECK_ARG(kind == 'f' || kind == 'i' || kind == 'u',
                       "expected a real-valued numeric array, got dtype {}",
                       std::string(py::str(array.dtype())));
    }
    require_copy_memory<T>(array);
    FloatArray converted(Base::ensure(array));
    COBALT_CHECK_ARG(
        converted.ptr() != nullptr,
        "expected a real-valued numeric array: numpy could not convert the {} to {}-byte floats",
        describe_array(array), sizeof(T));
    return converted;
  }
};

// Input array of integral T, C-contiguous, zero-copy when the source already is that. Unlike a
// plain forcecast it never changes a value: non-integer dtypes (float, bool, object) and values
// outside T's range are a ValueError naming the range (see the type_caster below).
template <typename T>
class IntArray : public py::array_t<T, py::array::c_style | py::array::forcecast> {
  using Base = py::array_t<T, py::array::c_style | py::array::forcecast>;

 public:
  using Base::Base;
  IntArray() : Base() {}
  explicit IntArray(Base&& base) : Base(std::move(base)) {}

  // `src` (a numpy array, torch CPU tensor, nested list, ...) as C-contiguous T. A C-contiguous
  // native int64/uint64/int32/uint32 source that T cannot hold as is (int64 ids for an int32
  // argument: what torch.topk returns) is narrowed in one checked pass into a new array; *fresh
  // (when given) is then set true: the result is a new array that nothing else references.
  // Otherwise it is false (the result may be `src` itself or share its memory).
  static IntArray from(py::handle src, bool* fresh = nullptr) {
    if (fresh != nullptr) *fresh = false;
    const bool given_array = py::isinstance<py::array>(src);
    py::array array = given_array ? py::reinterpret_borrow<py::array>(src)
                                  : py::array(py::module_::import("numpy").attr("asarray")(src));
    if (array.size() > 0) {
      const char kind = array.dtype().kind();
      // Something that is no array at all (a layout where ids belong) becomes an object array:
      // name what it was; a list or tuple did so because of its elements.
      if (!given_array && kind == 'O') {
        const std::string type = py::str(py::type::of(src).attr("__name__"));
        const bool sequence = py::isinstance<py::list>(src) || py::isinstance<py::tuple>(src);
        if (sequence) {
          fail(ErrorCode::kInvalidArgument,
               "expected integers, got a {} with elements that are not all integers in the "
               "int64 range (None, objects, values past 2^63)",
               type);
        }
        fail(ErrorCode::kInvalidArgument,
             "expected an integer array (numpy array, torch CPU tensor or list), got {}", type);
      }
      COBALT_CHECK_ARG(kind == 'i' || kind == 'u', "expected an integer array, got dtype {}{}",
                       std::string(py::str(array.dtype())),
                       kind == 'f' ? " (values would be truncated)" : "");
      // The element size through numpy's attribute, not pybind11's struct access: pybind11 before
      // 2.12 reads it at numpy 1's offset in the dtype (bench/gpu/build_python.sh may build these
      // bindings against numpy 2), and the narrowing below reads memory by it.
      const auto itemsize = py::cast<size_t>(array.dtype().attr("itemsize"));
      const bool fits =
          itemsize < sizeof(T) || (itemsize == sizeof(T) && (kind == 'i') == std::is_signed_v<T>);
      if (!fits) {
        if (std::optional<IntArray> narrowed = narrow_contiguous(array, itemsize)) {
          if (fresh != nullptr) *fresh = true;
          return std::move(*narrowed);
        }
        // A value out of range (or a layout the fast pass does not take): find the range for
        // the message.
        const py::object low = array.attr("min")(), high = array.attr("max")();
        const py::int_ min_t(std::numeric_limits<T>::min()), max_t(std::numeric_limits<T>::max());
        COBALT_CHECK_ARG(PyObject_RichCompareBool(low.ptr(), min_t.ptr(), Py_GE) == 1 &&
                             PyObject_RichCompareBool(high.ptr(), max_t.ptr(), Py_LE) == 1,
                         "integer array values [{}, {}] out of range [{}, {}]",
                         std::string(py::str(low)), std::string(py::str(high)),
                         std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
      }
    }
    require_copy_memory<T>(array);
    // Empty arrays skip the dtype test above (np.asarray([]) is float64), so numpy's conversion
    // can still fail here (an empty structured array): ensure() then returns a null handle.
    IntArray converted(Base::ensure(array));
    COBALT_CHECK_ARG(
        converted.ptr() != nullptr,
        "expected an integer array: numpy could not convert the {} to {}-byte integers",
        describe_array(array), sizeof(T));
    return converted;
  }

  // A new C-contiguous array of `shape` (elements not initialised) whose memory a capsule owns:
  // once marked read-only, numpy refuses to make it writeable again (it allows that for an array
  // owning its data), so a RoutingBatch's private copy stays what was validated.
  static IntArray new_private(const std::vector<py::ssize_t>& shape) {
    size_t count = 1;
    std::vector<py::ssize_t> strides(shape.size());
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = static_cast<py::ssize_t>(count * sizeof(T));
      count *= static_cast<size_t>(shape[i]);
    }
    std::unique_ptr<T[]> data(new T[count > 0 ? count : 1]);
    py::capsule owner(data.get(), [](void* p) { delete[] static_cast<T*>(p); });
    T* raw = data.release();  // the capsule owns it now
    return IntArray(Base(shape, strides, raw, owner));
  }

 private:
  // The checked narrowing of a C-contiguous, native-order array of S into a new T array; nullopt
  // when some value does not fit (the caller reports the range).
  template <typename S>
  static std::optional<IntArray> narrow_as(const py::array& array) {
    const S* in = static_cast<const S*>(array.data());
    IntArray out = new_private({array.shape(), array.shape() + array.ndim()});
    T* dst = out.mutable_data();
    const auto count = static_cast<size_t>(array.size());
    // The smallest and largest value as reductions beside the truncating copy, so that the loop
    // vectorises (a per-element fit test does not); all fit when both ends do.
    S low = in[0], high = in[0];  // count >= 1: from() takes empty arrays elsewhere
    for (size_t i = 0; i < count; ++i) {
      const S value = in[i];
      low = value < low ? value : low;
      high = value > high ? value : high;
      dst[i] = static_cast<T>(value);
    }
    if (!std::in_range<T>(low) || !std::in_range<T>(high)) return std::nullopt;
    return out;
  }

  // narrow_as for the source dtypes the fast pass takes; nullopt for the others, for
  // non-contiguous, misaligned or non-native arrays, and when a value does not fit.
  static std::optional<IntArray> narrow_contiguous(const py::array& array, size_t itemsize) {
    if ((array.flags() & py::array::c_style) == 0 ||
        !py::cast<bool>(array.attr("flags").attr("aligned")) ||
        !py::cast<bool>(array.dtype().attr("isnative"))) {
      return std::nullopt;
    }
    const bool is_signed = array.dtype().kind() == 'i';
    switch (itemsize) {
      case 8:
        return is_signed ? narrow_as<int64_t>(array) : narrow_as<uint64_t>(array);
      case 4:
        return is_signed ? narrow_as<int32_t>(array) : narrow_as<uint32_t>(array);
      default:
        return std::nullopt;
    }
  }
};

// IntArray<T>::from with `what` (the argument) named in its errors.
template <typename T>
IntArray<T> int_array(py::handle src, const char* what, bool* fresh = nullptr) {
  try {
    return IntArray<T>::from(src, fresh);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", what, e.what()));
  }
}

// InArray<T>: the input array type for T (integral: IntArray, floating: FloatArray).
template <typename T>
using InArray = std::conditional_t<std::is_integral_v<T>, IntArray<T>, FloatArray<T>>;

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

// A read-only C-contiguous copy of `array` whose memory a capsule owns, so that numpy refuses to
// make it writeable again: for inputs an object validates once and reads later (also with the
// GIL released), which the caller must not be able to change under it.
template <typename T, int Flags>
py::array_t<T, Flags> private_readonly_copy(const py::array_t<T, Flags>& array) {
  const std::vector<py::ssize_t> shape(array.shape(), array.shape() + array.ndim());
  const auto count = static_cast<size_t>(array.size());
  std::unique_ptr<T[]> data(new T[count > 0 ? count : 1]);
  std::copy(array.data(), array.data() + count, data.get());
  py::capsule owner(data.get(), [](void* p) { delete[] static_cast<T*>(p); });
  T* raw = data.release();  // the capsule owns it now
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t step = sizeof(T);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  py::array_t<T, Flags> copy(shape, strides, raw, owner);
  copy.attr("setflags")(py::arg("write") = false);
  return copy;
}

// Through numpy's public API (ndarray.setflags), not pybind11's internal array proxy: the bindings
// are also built against other pybind11 and numpy versions (bench/gpu/build_python.sh).
inline void mark_readonly(py::array& array) { array.attr("setflags")(py::arg("write") = false); }

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

template <typename T, int Flags>
std::span<const T> span_of(const py::array_t<T, Flags>& array) {
  return std::span<const T>(array.data(), static_cast<size_t>(array.size()));
}

template <typename T, int Flags>
std::vector<T> vector_of(const py::array_t<T, Flags>& array) {
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

// A Python integer for a C++ int field or argument (taken as int64 by the binding): a value
// outside int32 is an InvalidArgumentError naming `name`, where an int parameter made pybind11
// raise its multi-line TypeError listing every signature.
inline int int_arg(int64_t value, const char* name) {
  COBALT_CHECK_ARG(
      value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(),
      "{} {} out of range for a 32-bit integer [{}, {}]", name, value,
      std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  return static_cast<int>(value);
}

// An integer argument of a binding, as a Python int (from int, numpy integer: anything with
// __index__; a float, str or array is declined, so pybind11 reports the call's signatures as for
// any wrong type). Read it with int_arg / uint64_arg, which name the argument when the value does
// not fit: a C++ int parameter made pybind11 raise its multi-line TypeError listing every signature
// for 2**40. Signatures show it as `int`.
struct PyInt {
  py::object value;
};

// A Python integer as uint64: a negative value or one of 2^64 or more is an InvalidArgumentError
// naming `name`.
inline uint64_t uint64_arg(py::handle value, const char* name) {
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) {
    PyErr_Clear();
    throw py::type_error(fmt::format("{} must be an integer, got {}", name,
                                     std::string(py::str(py::type::of(value).attr("__name__")))));
  }
  const unsigned long long result = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    fail(ErrorCode::kInvalidArgument, "{} {} out of range [0, 2^64 - 1]", name,
         std::string(py::str(index)));
  }
  return static_cast<uint64_t>(result);
}

inline uint64_t uint64_arg(const PyInt& value, const char* name) {
  return uint64_arg(value.value, name);
}

// operator.index(value) of a PyInt, and its value as a long long when it fits (`fits` false
// otherwise): what int_arg and int64_arg check.
struct PyIndexValue {
  py::object index;
  long long value = 0;
  bool fits = false;
};
inline PyIndexValue index_value(const PyInt& value) {
  PyIndexValue out;
  out.index = py::reinterpret_steal<py::object>(PyNumber_Index(value.value.ptr()));
  if (!out.index) throw py::error_already_set();
  int overflow = 0;
  out.value = PyLong_AsLongLongAndOverflow(out.index.ptr(), &overflow);
  if (out.value == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  out.fits = overflow == 0;
  return out;
}

// A PyInt as int: a value outside int32 is an InvalidArgumentError naming `name`.
inline int int_arg(const PyInt& value, const char* name) {
  const PyIndexValue v = index_value(value);
  if (!v.fits || v.value < std::numeric_limits<int>::min() ||
      v.value > std::numeric_limits<int>::max()) {
    fail(ErrorCode::kInvalidArgument, "{} {} out of range for a 32-bit integer [{}, {}]", name,
         std::string(py::str(v.index)), std::numeric_limits<int>::min(),
         std::numeric_limits<int>::max());
  }
  return static_cast<int>(v.value);
}

// A PyInt as int64: a value outside int64 is an InvalidArgumentError naming `name`.
inline int64_t int64_arg(const PyInt& value, const char* name) {
  const PyIndexValue v = index_value(value);
  if (!v.fits) {
    fail(ErrorCode::kInvalidArgument, "{} {} out of range for a 64-bit integer [-2^63, 2^63 - 1]",
         name, std::string(py::str(v.index)));
  }
  return static_cast<int64_t>(v.value);
}

inline std::optional<int64_t> int64_arg(const std::optional<PyInt>& value, const char* name) {
  if (!value) return std::nullopt;
  return int64_arg(*value, name);
}

// Read-write int fields of a bound struct (the fields' names and pointers to members): a value
// set outside int32 is an InvalidArgumentError naming the field (def_readwrite raised pybind11's
// TypeError).
template <typename Class, typename... Options>
void def_int_fields(py::class_<Class, Options...>& cls,
                    std::initializer_list<std::pair<const char*, int Class::*>> fields) {
  for (const auto& [name, field] : fields) {
    cls.def_property(
        name, [field = field](const Class& c) { return c.*field; },
        [name = name, field = field](Class& c, PyInt v) { c.*field = int_arg(v, name); });
  }
}

}  // namespace cobalt::py_bindings

namespace pybind11::detail {

template <>
struct type_caster<cobalt::py_bindings::PyInt> {
  PYBIND11_TYPE_CASTER(cobalt::py_bindings::PyInt, const_name("int"));

  // Holds operator.index(src), a Python int. Declines what has no integer value (a float, a
  // str, an array of more than one element), so that pybind11 tries the next overload.
  bool load(handle src, bool /*convert*/) {
    if (!src || PyFloat_Check(src.ptr()) || PyIndex_Check(src.ptr()) == 0) return false;
    object index = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
    if (!index) {
      PyErr_Clear();
      return false;
    }
    value.value = std::move(index);
    return true;
  }
  static handle cast(const cobalt::py_bindings::PyInt& src, return_value_policy, handle) {
    return src.value.inc_ref();
  }
};

// None and plain Python numbers are not arrays: the array casters below decline them, so that
// pybind11 tries the next overload (TraceData(E, top_k, counts) after TraceData(E, topk_ids, ...))
// or reports the call's signatures. A numpy scalar (np.int64(2)) is a number too:
// TraceData(8, np.int64(2), counts) took the token-trace overload with it as a 0-d array of ids.
inline bool declined_as_array(handle src) {
  static const handle numpy_scalar =
      object(module_::import("numpy").attr("generic")).release();  // kept for the process
  return src.is_none() || PyLong_Check(src.ptr()) || PyFloat_Check(src.ptr()) ||
         isinstance(src, numpy_scalar);
}

// Loads IntArray<T> arguments through IntArray<T>::from (errors are ValueErrors, not "incompatible
// function arguments"). pybind11 casts every py::object subclass through pyobject_caster.
template <typename T>
struct pyobject_caster<cobalt::py_bindings::IntArray<T>> {
  PYBIND11_TYPE_CASTER(cobalt::py_bindings::IntArray<T>, const_name("numpy.ndarray"));

  bool load(handle src, bool /*convert*/) {
    if (declined_as_array(src)) return false;
    value = cobalt::py_bindings::IntArray<T>::from(src);
    return true;
  }
  static handle cast(const cobalt::py_bindings::IntArray<T>& src, return_value_policy, handle) {
    return src.inc_ref();
  }
};

// Loads FloatArray<T> arguments through FloatArray<T>::from (declining as IntArray's caster).
template <typename T>
struct pyobject_caster<cobalt::py_bindings::FloatArray<T>> {
  PYBIND11_TYPE_CASTER(cobalt::py_bindings::FloatArray<T>, const_name("numpy.ndarray"));

  bool load(handle src, bool /*convert*/) {
    if (declined_as_array(src)) return false;
    value = cobalt::py_bindings::FloatArray<T>::from(src);
    return true;
  }
  static handle cast(const cobalt::py_bindings::FloatArray<T>& src, return_value_policy, handle) {
    return src.inc_ref();
  }
};

}  // namespace pybind11::detail
