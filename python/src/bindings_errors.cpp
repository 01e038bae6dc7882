// cobalt::Error -> Python: kInvalidArgument raises InvalidArgumentError (a ValueError),
// kFailedPrecondition FailedPreconditionError and kInternal InternalError (both RuntimeErrors),
// each with the C++ message unchanged. A failed file operation (cobalt::IoError) raises IoError,
// an InvalidArgumentError that is also an OSError with the operation's errno: IoFileNotFoundError
// (a FileNotFoundError) for ENOENT, IoPermissionError (a PermissionError) for EACCES and EPERM.
#include <cerrno>
#include <cstring>

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
  static PyObject* io_error = PyErr_NewExceptionWithDoc(
      "cobalt._core.IoError",
      "A failed file operation (open, map, write, rename): an InvalidArgumentError and an OSError "
      "whose errno is the operation's (None when no system call failed).",
      py::make_tuple(py::handle(invalid_argument), py::handle(PyExc_OSError)).release().ptr(),
      nullptr);
  static PyObject* io_not_found = PyErr_NewExceptionWithDoc(
      "cobalt._core.IoFileNotFoundError", "An IoError for a file that does not exist (ENOENT).",
      py::make_tuple(py::handle(io_error), py::handle(PyExc_FileNotFoundError)).release().ptr(),
      nullptr);
  static PyObject* io_permission = PyErr_NewExceptionWithDoc(
      "cobalt._core.IoPermissionError",
      "An IoError for a file operation its permissions refuse (EACCES, EPERM).",
      py::make_tuple(py::handle(io_error), py::handle(PyExc_PermissionError)).release().ptr(),
      nullptr);
  m.add_object("InvalidArgumentError", py::handle(invalid_argument).inc_ref());
  m.add_object("IoError", py::handle(io_error).inc_ref());
  m.add_object("IoFileNotFoundError", py::handle(io_not_found).inc_ref());
  m.add_object("IoPermissionError", py::handle(io_permission).inc_ref());
  m.add_object("FailedPreconditionError", py::handle(failed_precondition).inc_ref());
  m.add_object("InternalError", py::handle(internal).inc_ref());

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      const int err = e.os_errno();
      PyObject* type = err == ENOENT                   ? io_not_found
                       : err == EACCES || err == EPERM ? io_permission
                                                       : io_error;
      // The message stays the exception's text: errno is set, strerror is not (OSError would
      // print "[Errno N] strerror" instead).
      const py::object text = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
          e.what(), static_cast<Py_ssize_t>(std::strlen(e.what())), "replace"));
      if (!text) return;  // its own error (out of memory) is set
      py::object exception =
          py::reinterpret_steal<py::object>(PyObject_CallOneArg(type, text.ptr()));
      if (!exception) return;
      if (err != 0) exception.attr("errno") = err;
      PyErr_SetObject(type, exception.ptr());
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
