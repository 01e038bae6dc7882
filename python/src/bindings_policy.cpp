// policy/: PolicyConfig, Policy (static, cobalt, ... whatever the registry holds), make_policy.
#include <pybind11/stl.h>

#include <mutex>
#include <optional>

#include "bindings_common.hpp"
#include "cobalt/policy/policy.hpp"
#include "py_routing_batch.hpp"

namespace cobalt::py_bindings {
namespace {

using LayoutPtr = std::shared_ptr<ExpertLayout>;

LayoutPtr mutable_ptr(std::shared_ptr<const ExpertLayout> p) {
  return std::const_pointer_cast<ExpertLayout>(std::move(p));
}

// A policy with the config it was made from, so calls can be checked against it (the C++ policies
// trust their callers' shapes).
struct PyPolicy {
  std::unique_ptr<policy::Policy> impl;
  policy::PolicyConfig config;
  // Serialises calls from several Python threads (run releases the GIL; a policy is stateful).
  // Taken after the GIL is released, so a thread waiting for it never holds the GIL.
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();

  PyPolicy(std::unique_ptr<policy::Policy> policy, policy::PolicyConfig policy_config)
      : impl(std::move(policy)), config(std::move(policy_config)) {}
  PyPolicy(PyPolicy&&) = default;
  PyPolicy& operator=(PyPolicy&&) = default;
  // Destroying a policy waits for its background plans (async_planning), which can take a
  // second at E = 1024: without the GIL, so other Python threads run meanwhile. (The plans never
  // take the GIL; the object is unreachable from Python by now.)
  ~PyPolicy() {
    if (impl && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      impl.reset();
    }
  }

  void check_batch(const RoutingBatch& b, int layer) const {
    COBALT_CHECK_ARG(b.num_experts() == config.num_experts && b.top_k() == config.top_k &&
                         b.num_ranks() == config.topology.num_ranks(),
                     "policy {}: batch has E={}, K={}, G={} but the policy was made for E={}, "
                     "K={}, G={}",
                     impl->name(), b.num_experts(), b.top_k(), b.num_ranks(), config.num_experts,
                     config.top_k, config.topology.num_ranks());
    COBALT_CHECK_ARG(layer >= 0 && layer < config.num_layers,
                     "policy {}: layer {} out of range [0, {})", impl->name(), layer,
                     config.num_layers);
  }
};

}  // namespace

void bind_policy(py::module_& m) {
  using policy::PolicyConfig;
  py::class_<PolicyConfig> config_class(m, "PolicyConfig",
                                        "Everything a policy needs to know (policy.hpp).");
  config_class
      .def(py::init([](const Topology& topology, PyInt num_experts, PyInt top_k, PyInt num_layers,
                       PyInt slots_per_rank, double eps, PyInt steps_per_global_plan,
                       double ema_decay, py::object seed, PyInt num_threads, bool async_planning,
                       PyInt planner_restarts, double token_bytes, double expert_param_bytes,
                       std::optional<eval::CostParams> cost_model, double gemm_flops_per_s) {
             PolicyConfig c;
             c.topology = topology;
             c.num_experts = int_arg(num_experts, "num_experts");
             c.top_k = int_arg(top_k, "top_k");
             c.num_layers = int_arg(num_layers, "num_layers");
             c.slots_per_rank = int_arg(slots_per_rank, "slots_per_rank");
             c.eps = eps;
             c.steps_per_global_plan = int_arg(steps_per_global_plan, "steps_per_global_plan");
             c.ema_decay = ema_decay;
             c.seed = uint64_arg(seed, "seed");
             c.num_threads = int_arg(num_threads, "num_threads");
             c.async_planning = async_planning;
             c.planner_restarts = int_arg(planner_restarts, "planner_restarts");
             c.token_bytes = token_bytes;
             c.expert_param_bytes = expert_param_bytes;
             c.cost_model = cost_model;
             c.gemm_flops_per_s = gemm_flops_per_s;
             return c;
           }),
           py::arg("topology"), py::arg("num_experts"), py::arg("top_k"), py::arg("num_layers") = 1,
           py::arg("slots_per_rank") = 0, py::arg("eps") = 0.15,
           py::arg("steps_per_global_plan") = 10, py::arg("ema_decay") = 0.9, py::arg("seed") = 0,
           py::arg("num_threads") = 1, py::arg("async_planning") = false,
           py::arg("planner_restarts") = 8, py::arg("token_bytes") = PolicyConfig{}.token_bytes,
           py::arg("expert_param_bytes") = PolicyConfig{}.expert_param_bytes,
           py::arg("cost_model") = py::none(),
           py::arg("gemm_flops_per_s") = plan::kAchievableGemmFlopsPerS)
      .def_readwrite("topology", &PolicyConfig::topology)
      .def_readwrite("eps", &PolicyConfig::eps)
      .def_readwrite("ema_decay", &PolicyConfig::ema_decay)
      .def_property(
          "seed", [](const PolicyConfig& c) { return c.seed; },
          [](PolicyConfig& c, py::object v) { c.seed = uint64_arg(v, "seed"); })
      .def_readwrite("async_planning", &PolicyConfig::async_planning)
      .def_readwrite("token_bytes", &PolicyConfig::token_bytes)
      .def_readwrite("expert_param_bytes", &PolicyConfig::expert_param_bytes)
      .def_readwrite("gemm_flops_per_s", &PolicyConfig::gemm_flops_per_s)
      .def_property(
          "cost_model", [](const PolicyConfig& c) { return c.cost_model; },  // a copy
          [](PolicyConfig& c, std::optional<eval::CostParams> cost) { c.cost_model = cost; },
          "CostParams or None: with one, cobalt+ prices its layouts in modelled step time "
          "(cobalt/policy/layout_pricing.hpp). Reading returns a copy.")
      .def("validate", &PolicyConfig::validate);
  def_int_fields(config_class, {{"num_experts", &PolicyConfig::num_experts},
                                {"top_k", &PolicyConfig::top_k},
                                {"num_layers", &PolicyConfig::num_layers},
                                {"slots_per_rank", &PolicyConfig::slots_per_rank},
                                {"steps_per_global_plan", &PolicyConfig::steps_per_global_plan},
                                {"num_threads", &PolicyConfig::num_threads},
                                {"planner_restarts", &PolicyConfig::planner_restarts}});

  py::class_<policy::PolicyCounters>(m, "PolicyCounters")
      .def_readonly("planner_wall_ms", &policy::PolicyCounters::planner_wall_ms)
      .def_readonly("async_plan_ms", &policy::PolicyCounters::async_plan_ms)
      .def_readonly("num_global_plans", &policy::PolicyCounters::num_global_plans)
      .def_readonly("intra_node_moves", &policy::PolicyCounters::intra_node_moves)
      .def_readonly("cross_node_moves", &policy::PolicyCounters::cross_node_moves)
      .def_readonly("max_solver_calls", &policy::PolicyCounters::max_solver_calls);

  py::class_<PyPolicy>(
      m, "Policy",
      "Decides the layout and the task assignment of each (step, layer); steps arrive in "
      "non-decreasing order per layer.")
      .def_property_readonly("name", [](const PyPolicy& p) { return p.impl->name(); })
      .def_property_readonly("needs_token_ids",
                             [](const PyPolicy& p) { return p.impl->needs_token_ids(); })
      // A copy: changing it would not change the policy (its C++ state was made from it).
      .def_property_readonly("config", [](const PyPolicy& p) { return PolicyConfig(p.config); })
      .def(
          "run",
          [](PyPolicy& p, PyInt step_in, PyInt layer_in, const PyRoutingBatch& b) {
            const int64_t step = int64_arg(step_in, "step");
            const int layer = int_arg(layer_in, "layer");
            p.check_batch(b.batch, layer);
            py::array_t<int32_t> exec({static_cast<py::ssize_t>(b.batch.num_tokens()),
                                       static_cast<py::ssize_t>(b.batch.top_k())});
            std::span<RankId> dst(exec.mutable_data(), static_cast<size_t>(b.batch.num_tasks()));
            std::shared_ptr<const ExpertLayout> layout;
            {
              py::gil_scoped_release release;
              const std::lock_guard<std::mutex> lock(*p.busy);
              layout = p.impl->run(step, layer, b.batch, dst);
            }
            return py::make_tuple(mutable_ptr(std::move(layout)), exec);
          },
          py::arg("step"), py::arg("layer"), py::arg("batch"),
          "Returns (layout in force, exec_rank [T, K] int32).")
      .def(
          "run_loads",
          [](PyPolicy& p, PyInt step_in, PyInt layer_in, InArray<int64_t> counts) {
            const int64_t step = int64_arg(step_in, "step");
            const int layer = int_arg(layer_in, "layer");
            require_ndim(counts, 2, "Policy.run_loads counts [G, E]");
            const auto g = static_cast<py::ssize_t>(counts.shape(0));
            COBALT_CHECK_ARG(
                g == p.config.topology.num_ranks() && counts.shape(1) == p.config.num_experts,
                "policy {}: counts has shape [{}, {}], expected [G={}, E={}]", p.impl->name(), g,
                counts.shape(1), p.config.topology.num_ranks(), p.config.num_experts);
            COBALT_CHECK_ARG(layer >= 0 && layer < p.config.num_layers,
                             "policy {}: layer {} out of range [0, {})", p.impl->name(), layer,
                             p.config.num_layers);
            std::vector<int64_t> loads(static_cast<size_t>(g));
            std::shared_ptr<const ExpertLayout> layout;
            // A private copy: the caller's array could change while the GIL is released, after
            // run_loads checked it.
            const std::vector<int64_t> owned_counts = vector_of(counts);
            {
              py::gil_scoped_release release;
              const std::lock_guard<std::mutex> lock(*p.busy);
              layout = p.impl->run_loads(step, layer, owned_counts, loads);
            }
            return py::make_tuple(mutable_ptr(std::move(layout)),
                                  owned_array(std::move(loads), {g}));
          },
          py::arg("step"), py::arg("layer"), py::arg("counts"),
          "Load-only replay: counts [G, E] -> (layout, rank_loads [G] int64).")
      .def_property_readonly("counters", [](const PyPolicy& p) {
        policy::PolicyCounters counters;
        {
          py::gil_scoped_release release;
          const std::lock_guard<std::mutex> lock(*p.busy);
          counters = p.impl->counters();
        }
        return counters;
      });

  m.def("policy_names", &policy::policy_names, "Registered policy names, in display order.");
  m.def(
      "make_policy",
      [](const std::string& name, const policy::PolicyConfig& config) {
        return PyPolicy{policy::make_policy(name, config), config};
      },
      py::arg("name"), py::arg("config"),
      "Raises InvalidArgumentError listing the valid names for an unknown name.");
}

}  // namespace cobalt::py_bindings
