// cobalt::Error -> Python: kInvalidArgument raises InvalidArgumentError (a ValueError),
// kFailedPrecondition FailedPreconditionError and kInternal InternalError (both RuntimeErrors),
// each with the C++ message unchanged.
#include "bindings_common.hpp"

namespace cobalt::py_bindings {

void bind_errors(py::module_& m) {
  // Module-level objects live as long as the module: keep new references in statics.
  static PyObject* invalid_argument = PyErr_NewExceptionWithDoc(
      "cobalt._core.InvalidArgumentError",
      "A malformed or out-of-range argument (cobalt::ErrorCode::kInvalidArgument).",
      PyExc_ValueError, nullptr);
  static PyObject* failed_precondition = PyErr_NewExceptionWithDoc(
      "cobalt._core.FailedPreconditionError",
      "Well-formed inputs that cannot be satisfied (cobalt::ErrorCode::kFailedPrecondition).",
      PyExc_RuntimeError, nullptr);
  static PyObject* internal =
      PyErr_NewExceptionWithDoc("cobalt._core.InternalError",
                                "A broken invariant inside Cobalt (cobalt::ErrorCode::kInternal).",
                                PyExc_RuntimeError, nullptr);
  m.add_object("InvalidArgumentError", py::handle(invalid_argument).inc_ref());
  m.add_object("FailedPreconditionError", py::handle(failed_precondition).inc_ref());
  m.add_object("InternalError", py::handle(internal).inc_ref());

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = internal;
      switch (e.code()) {
        case ErrorCode::kInvalidArgument:
          type = invalid_argument;
          break;
        case ErrorCode::kFailedPrecondition:
          type = failed_precondition;
          break;
        case ErrorCode::kInternal:
          type = internal;
          break;
      }
      PyErr_SetString(type, e.what());
    }
  });
}

}  // namespace cobalt::py_bindings
