// eval/cost_model: the simulator's cost parameters (CostParams) and its cluster/model presets, so a
// policy can price layouts (PolicyConfig.cost_model) from Python too.
#include <pybind11/stl.h>

#include "bindings_common.hpp"
#include "cobalt/eval/cost_model.hpp"

namespace cobalt::py_bindings {

void bind_cost(py::module_& m) {
  using eval::CostParams;
  py::class_<CostParams> cost_params(m, "CostParams",
                                     "Cost model of the simulator (cobalt/eval/cost_model.hpp): "
                                     "link bandwidths, GPU throughput, model sizes, step "
                                     "structure.");
  def_int_fields(cost_params, {{"hidden_size", &CostParams::hidden_size},
                               {"expert_ffn_size", &CostParams::expert_ffn_size},
                               {"bytes_per_element", &CostParams::bytes_per_element},
                               {"matmuls_per_expert", &CostParams::matmuls_per_expert},
                               {"exchanges_per_layer", &CostParams::exchanges_per_layer}});
  cost_params.def(py::init<>())
      .def_static(
          "from_presets",
          [](const std::string& cluster, const std::string& model) {
            return eval::make_cost_params(eval::cluster_preset(cluster), eval::model_preset(model));
          },
          py::arg("cluster") = "4x8-b200", py::arg("model") = "glm-4.5-air",
          "The parameters of a cluster preset (4x8-b200, 4x8-h800) and a model preset.")
      .def_readwrite("nvlink_bytes_per_s", &CostParams::nvlink_bytes_per_s)
      .def_readwrite("ib_bytes_per_s_per_node", &CostParams::ib_bytes_per_s_per_node)
      .def_readwrite("achievable_flops", &CostParams::achievable_flops)
      .def_readwrite("fwd_bwd_flops_factor", &CostParams::fwd_bwd_flops_factor)
      .def_readwrite("overlap_fraction", &CostParams::overlap_fraction)
      .def_readwrite("grad_bytes_per_element", &CostParams::grad_bytes_per_element)
      .def_readwrite("param_refresh", &CostParams::param_refresh)
      .def_readwrite("optimizer_factor", &CostParams::optimizer_factor)
      .def_readwrite("planner_time_scale", &CostParams::planner_time_scale)
      .def_readwrite("planner_overlap", &CostParams::planner_overlap)
      .def_property_readonly("token_bytes", &CostParams::token_bytes)
      .def_property_readonly("expert_param_bytes", &CostParams::expert_param_bytes)
      .def_property_readonly("flops_per_task", &CostParams::flops_per_task)
      .def("validate", &CostParams::validate);
}

}  // namespace cobalt::py_bindings
