// plan/: Cobalt stage 1 (node-level problem, multi-start heuristic, rank packing) and stage 2
// (intra-node rebalancing).
#include <pybind11/stl.h>

#include <optional>

#include "bindings_common.hpp"
#include "cobalt/plan/floor_swaps.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/intra_node_rebalance.hpp"
#include "cobalt/plan/node_plan.hpp"

namespace cobalt::py_bindings {
namespace {

using LayoutPtr = std::shared_ptr<ExpertLayout>;

// GlobalPlanInput whose arrays Python owns (the C++ struct only views them): read-only copies made
// at construction, so they stay what was validated.
struct PyPlanInput {
  Topology topology{1, 1};
  int num_experts = 0;
  int slots_per_rank = 0;
  double eps = 0.15;
  InArray<double> expert_load;
  InArray<double> coactivation;
  std::optional<InArray<double>> source_demand;
  double source_weight = 0.0;

  plan::GlobalPlanInput view() const {
    plan::GlobalPlanInput in{
        topology, num_experts, slots_per_rank, eps, span_of(expert_load), span_of(coactivation),
        {},       0.0};
    if (source_demand.has_value()) {
      in.source_demand = span_of(*source_demand);
      in.source_weight = source_weight;
    }
    return in;
  }
};

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<PyPlanInput>(
      m, "GlobalPlanInput",
      "Inputs of a stage-1 plan: loads w_e [E], co-activation c_ij [E, E], optional source "
      "demand d_ne [N, E] (cobalt+ anchoring).")
      .def(py::init([](const Topology& topology, PyInt num_experts_in, PyInt slots_per_rank_in,
                       InArray<double> load, InArray<double> coact, double eps,
                       std::optional<InArray<double>> demand, double source_weight) {
             const int num_experts = int_arg(num_experts_in, "num_experts");
             const int slots_per_rank = int_arg(slots_per_rank_in, "slots_per_rank");
             // Own read-only copies: validated here, read by every later call (with the GIL
             // released), so the caller's arrays must not be the ones read.
             if (demand.has_value()) demand = private_readonly_copy(*demand);
             PyPlanInput in{topology,
                            num_experts,
                            slots_per_rank,
                            eps,
                            private_readonly_copy(load),
                            private_readonly_copy(coact),
                            std::move(demand),
                            source_weight};
             in.view().validate();
             return in;
           }),
           py::arg("topology"), py::arg("num_experts"), py::arg("slots_per_rank"),
           py::arg("expert_load"), py::arg("coactivation"), py::arg("eps") = 0.15,
           py::arg("source_demand") = py::none(), py::arg("source_weight") = 0.0)
      .def_readonly("topology", &PyPlanInput::topology)
      .def_readonly("num_experts", &PyPlanInput::num_experts)
      .def_readonly("slots_per_rank", &PyPlanInput::slots_per_rank)
      .def_readonly("eps", &PyPlanInput::eps)
      .def_readonly("expert_load", &PyPlanInput::expert_load)
      .def_readonly("coactivation", &PyPlanInput::coactivation)
      .def("total_load", [](const PyPlanInput& in) { return in.view().total_load(); })
      .def("rank_load_cap", [](const PyPlanInput& in) { return in.view().rank_load_cap(); });

  py::class_<plan::NodePlan>(m, "NodePlan",
                             "Replica counts x_en [E, N] and expected loads u_en [E, N].")
      .def_readonly("num_experts", &plan::NodePlan::num_experts)
      .def_readonly("num_nodes", &plan::NodePlan::num_nodes)
      .def_property_readonly(
          "replicas",
          [](py::object self) {
            const auto& p = self.cast<const plan::NodePlan&>();
            return view_of(std::span<const int>(p.replicas), {p.num_experts, p.num_nodes}, self);
          })
      .def_property_readonly("load_share", [](py::object self) {
        const auto& p = self.cast<const plan::NodePlan&>();
        return view_of(std::span<const double>(p.load_share), {p.num_experts, p.num_nodes}, self);
      });

  py::class_<plan::HeuristicResult>(m, "HeuristicResult")
      .def_readonly("plan", &plan::HeuristicResult::plan)
      .def_readonly("objective", &plan::HeuristicResult::objective)
      .def_readonly("best_restart", &plan::HeuristicResult::best_restart)
      .def_readonly("within_cap", &plan::HeuristicResult::within_cap)
      .def_property_readonly("restart_within_cap",
                             [](const plan::HeuristicResult& r) {
                               return std::vector<bool>(r.restart_within_cap.begin(),
                                                        r.restart_within_cap.end());
                             })
      .def_readonly("restart_objectives", &plan::HeuristicResult::restart_objectives)
      .def_readonly("restart_plans", &plan::HeuristicResult::restart_plans);

  m.def(
      "plan_global_heuristic",
      [](const PyPlanInput& in, PyInt num_restarts_in, PyInt seed_in, bool use_metis,
         PyInt max_local_search_passes_in) {
        const int num_restarts = int_arg(num_restarts_in, "num_restarts");
        const uint64_t seed = uint64_arg(seed_in, "seed");
        const int max_local_search_passes =
            int_arg(max_local_search_passes_in, "max_local_search_passes");
        plan::HeuristicOptions options{num_restarts, seed, use_metis, max_local_search_passes};
        const auto input = in.view();
        py::gil_scoped_release release;
        return plan::plan_global_heuristic(input, options);
      },
      py::arg("input"), py::arg("num_restarts") = 4, py::arg("seed") = 0,
      py::arg("use_metis") = true, py::arg("max_local_search_passes") = 50,
      "Cobalt stage 1, multi-start heuristic (releases the GIL: safe on a background thread).");
  m.def(
      "pack_ranks",
      [](const PyPlanInput& in, const plan::NodePlan& node_plan,
         std::optional<LayoutPtr> previous) {
        std::vector<double> loads;
        const auto input = in.view();
        const ExpertLayout* prev = previous.has_value() ? previous->get() : nullptr;
        auto layout = [&] {
          py::gil_scoped_release release;
          return std::make_shared<ExpertLayout>(plan::pack_ranks(input, node_plan, prev, &loads));
        }();
        const int g = layout->num_ranks(), s = layout->slots_per_rank();
        return py::make_tuple(layout, owned_array(std::move(loads), {g, s}));
      },
      py::arg("input"), py::arg("plan"), py::arg("previous") = py::none(),
      "Places each node's replicas on its ranks: (ExpertLayout, expected slot loads [G, S]).");
  m.def(
      "node_plan_of",
      [](const ExpertLayout& layout, InArray<double> load) {
        COBALT_CHECK_ARG(load.size() == layout.num_experts(),
                         "node_plan_of: {} loads for {} experts", load.size(),
                         layout.num_experts());
        return plan::node_plan_of(layout, span_of(load));
      },
      py::arg("layout"), py::arg("expert_load"));
  m.def(
      "coactivation_objective",
      [](const PyPlanInput& in, const plan::NodePlan& p) {
        return plan::coactivation_objective(in.view(), p);
      },
      py::arg("input"), py::arg("plan"), "Eq. (3) objective of a node plan.");
  m.def(
      "check_node_plan",
      [](const PyPlanInput& in, const plan::NodePlan& p) {
        return plan::check_node_plan(in.view(), p);
      },
      py::arg("input"), py::arg("plan"), "'' when the plan is feasible, else the first violation.");

  py::class_<plan::RebalanceResult>(m, "RebalanceResult")
      .def_property_readonly(
          "layout",
          [](const plan::RebalanceResult& r) { return std::make_shared<ExpertLayout>(r.layout); })
      .def_property_readonly("slot_loads",
                             [](py::object self) {
                               const auto& r = self.cast<const plan::RebalanceResult&>();
                               return view_of(std::span<const double>(r.slot_loads),
                                              {r.layout.num_ranks(), r.layout.slots_per_rank()},
                                              self);
                             })
      .def_readonly("num_moves", &plan::RebalanceResult::num_moves);
  m.def(
      "rebalance_intra_node",
      [](const ExpertLayout& layout, InArray<double> slot_loads, double min_gain) {
        COBALT_CHECK_ARG(slot_loads.size() ==
                             static_cast<py::ssize_t>(layout.num_ranks()) * layout.slots_per_rank(),
                         "rebalance_intra_node: {} slot loads for {} x {} slots", slot_loads.size(),
                         layout.num_ranks(), layout.slots_per_rank());
        const std::vector<double> owned_loads = vector_of(slot_loads);  // see swap_toward_floor
        py::gil_scoped_release release;
        return plan::rebalance_intra_node(layout, owned_loads, min_gain);
      },
      py::arg("layout"), py::arg("slot_loads"), py::arg("min_gain") = 0.01,
      "Cobalt stage 2: repack each node's replicas over its ranks (slot_loads [G, S]).");

  py::class_<plan::FloorSwapResult>(m, "FloorSwapResult")
      .def_property_readonly(
          "layout",
          [](const plan::FloorSwapResult& r) { return std::make_shared<ExpertLayout>(r.layout); })
      .def_property_readonly(
          "swaps",
          [](const plan::FloorSwapResult& r) {
            py::list out;
            for (const auto& s : r.swaps) {
              out.append(py::make_tuple(s.rank, s.slot, s.removed, s.added, s.floor_after,
                                        s.exchange_rank, s.exchange_slot));
            }
            return out;
          })
      .def_readonly("floor_before", &plan::FloorSwapResult::floor_before)
      .def_readonly("floor_after", &plan::FloorSwapResult::floor_after);
  m.def(
      "swap_toward_floor",
      [](const ExpertLayout& layout, InArray<int64_t> expert_counts, InArray<double> removal_cost,
         double tolerance, PyInt max_swaps_in, PyInt max_checks_in, PyInt max_exchange_checks_in,
         PyInt max_group_swaps_in) {
        const int max_swaps = int_arg(max_swaps_in, "max_swaps");
        const int max_checks = int_arg(max_checks_in, "max_checks");
        const int max_exchange_checks = int_arg(max_exchange_checks_in, "max_exchange_checks");
        const int max_group_swaps = int_arg(max_group_swaps_in, "max_group_swaps");
        // Private copies: the caller's arrays could change while the GIL is released, after they
        // were checked (an expert count turned negative or an index out of range).
        const std::vector<int64_t> owned_counts = vector_of(expert_counts);
        const std::vector<double> owned_cost = vector_of(removal_cost);
        py::gil_scoped_release release;
        return plan::swap_toward_floor(
            layout, owned_counts, owned_cost,
            {tolerance, max_swaps, max_checks, max_exchange_checks, max_group_swaps});
      },
      py::arg("layout"), py::arg("expert_counts"), py::arg("removal_cost"),
      py::arg("tolerance") = 0.05, py::arg("max_swaps") = 1, py::arg("max_checks") = 64,
      py::arg("max_exchange_checks") = 256, py::arg("max_group_swaps") = 0,
      "cobalt+'s stage 2b: replica swaps that lower the layout's balance floor for expert_counts "
      "[E], cheapest first by removal_cost [N, E]; with max_group_swaps >= 2 also groups of swaps "
      "that lower it together (plan/floor_swaps.hpp).");
}

}  // namespace cobalt::py_bindings
