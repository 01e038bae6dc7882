// Phases of the GPU TopoEP solver (src/cuda/topoep.cu), shared with the host emulation: planning
// (topoep_plan_body.hpp) and quota emission (topoep_emit_body.hpp).
#pragma once

#include "detail/topoep_emit_body.hpp"
#include "detail/topoep_plan_body.hpp"
