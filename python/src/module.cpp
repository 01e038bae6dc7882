// cobalt._core: Python bindings of the Cobalt C++ core (one bindings_*.cpp per area).
#include "bindings_common.hpp"

PYBIND11_MODULE(_core, m) {
  using namespace cobalt::py_bindings;
  m.doc() =
      "Cobalt core: topology, expert layouts, routing statistics, planners, task assignment, "
      "policies, metrics and cobalt-trace I/O. C++ errors raise InvalidArgumentError "
      "(a ValueError) or FailedPreconditionError / InternalError (RuntimeErrors).";
  bind_errors(m);
  bind_core(m);
  bind_stats(m);
  bind_plan(m);
  bind_assign(m);
  bind_dispatch(m);
  bind_topoep(m);
  bind_cost(m);
  bind_policy(m);
  bind_eval(m);
  bind_io(m);
}
