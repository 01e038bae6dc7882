// core/: Topology, LinkParams, ExpertLayout (+ diff, slot budgets), RoutingBatch, assignment check.
#include <pybind11/stl.h>

#include <algorithm>

#include "bindings_common.hpp"
#include "cobalt/core/assignment.hpp"
#include "cobalt/core/environment.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/topology.hpp"
#include "py_routing_batch.hpp"

namespace cobalt::py_bindings {

namespace {

// A copy of `array` that nothing else references (IntArray::new_private).
IntArray<int32_t> private_copy(const IntArray<int32_t>& array) {
  IntArray<int32_t> copy =
      IntArray<int32_t>::new_private({array.shape(), array.shape() + array.ndim()});
  std::copy(array.data(), array.data() + array.size(), copy.mutable_data());
  return copy;
}

}  // namespace

PyRoutingBatch PyRoutingBatch::make(py::object topk_ids_in,
                                    std::optional<py::object> source_rank_in, PyInt num_experts_in,
                                    PyInt num_ranks_in) {
  const int num_experts = int_arg(num_experts_in, "num_experts");
  const int num_ranks = int_arg(num_ranks_in, "num_ranks");
  // Own copies, read-only: the batch is validated once and read later (also with the GIL
  // released), so the caller must not be able to change the ids under it. An int64 source is
  // narrowed into a new array, which is that copy.
  if (topk_ids_in.is_none()) throw py::type_error("RoutingBatch: topk_ids [T, K] is required");
  bool fresh = false;
  IntArray<int32_t> topk_ids = int_array<int32_t>(topk_ids_in, "RoutingBatch topk_ids", &fresh);
  require_ndim(topk_ids, 2, "RoutingBatch topk_ids [T, K]");
  if (!fresh) topk_ids = private_copy(topk_ids);
  mark_readonly(topk_ids);
  const auto num_tokens = static_cast<int64_t>(topk_ids.shape(0));
  const int top_k = static_cast<int>(topk_ids.shape(1));
  COBALT_CHECK_ARG(num_ranks >= 1, "RoutingBatch: number of ranks {} must be >= 1", num_ranks);
  IntArray<int32_t> src;
  if (source_rank_in.has_value()) {
    src = int_array<int32_t>(*source_rank_in, "RoutingBatch source_rank", &fresh);
    require_ndim(src, 1, "RoutingBatch source_rank [T]");
    COBALT_CHECK_ARG(src.shape(0) == num_tokens,
                     "RoutingBatch: source_rank has {} entries for {} tokens", src.shape(0),
                     num_tokens);
    if (!fresh) src = private_copy(src);
  } else {
    src = IntArray<int32_t>::new_private({static_cast<py::ssize_t>(num_tokens)});
    contiguous_source_ranks(num_tokens, num_ranks,
                            std::span<RankId>(src.mutable_data(), static_cast<size_t>(num_tokens)));
  }
  mark_readonly(src);
  auto ids = span_of(topk_ids);
  auto sources = span_of(src);
  // Always validated: every kernel indexes by these ids without a check.
  const RoutingBatch view(ids, sources, top_k, num_experts, num_ranks);
  return PyRoutingBatch{std::move(topk_ids), std::move(src), view};
}

namespace {

using LayoutPtr = std::shared_ptr<ExpertLayout>;

void bind_topology(py::module_& m) {
  py::class_<LinkParams>(m, "LinkParams", "Link bandwidths of the cost model (bytes/s, one way).")
      .def(py::init([](double nvlink, double ib) {
             return LinkParams{nvlink, ib};
           }),
           py::arg("nvlink_bytes_per_s") = 900e9, py::arg("ib_bytes_per_s_per_node") = 400e9)
      .def_readwrite("nvlink_bytes_per_s", &LinkParams::nvlink_bytes_per_s)
      .def_readwrite("ib_bytes_per_s_per_node", &LinkParams::ib_bytes_per_s_per_node);

  py::class_<Topology>(m, "Topology",
                       "N nodes of M ranks each (G = N*M); rank r lives on node r // M.")
      .def(py::init([](PyInt num_nodes, PyInt num_ranks, LinkParams links) {
             return Topology(int_arg(num_nodes, "number of nodes"),
                             int_arg(num_ranks, "number of ranks"), links);
           }),
           py::arg("num_nodes"), py::arg("num_ranks"), py::arg("links") = LinkParams{})
      .def_static("parse", &Topology::parse, py::arg("spec"), py::arg("links") = LinkParams{},
                  "Parses 'NxM' (N nodes, M ranks per node).")
      .def_property_readonly("num_nodes", &Topology::num_nodes)
      .def_property_readonly("num_ranks", &Topology::num_ranks)
      .def_property_readonly("ranks_per_node", &Topology::ranks_per_node)
      // A copy: the topology is immutable once validated (a reference would let Python change
      // the bandwidths of a layout's or a policy's topology under it).
      .def_property_readonly("links", [](const Topology& t) { return LinkParams(t.links()); })
      .def(
          "node_of",
          [](const Topology& t, RankId rank) {
            COBALT_CHECK_ARG(rank >= 0 && rank < t.num_ranks(), "rank {} out of range [0, {})",
                             rank, t.num_ranks());
            return t.node_of(rank);
          },
          py::arg("rank"))
      .def(
          "first_rank_of",
          [](const Topology& t, NodeId node) {
            COBALT_CHECK_ARG(node >= 0 && node < t.num_nodes(), "node {} out of range [0, {})",
                             node, t.num_nodes());
            return t.first_rank_of(node);
          },
          py::arg("node"))
      // Another type compares unequal (is_operator: NotImplemented, not a TypeError); equal
      // topologies hash equal, so a Topology can key a dict.
      .def("__eq__", &Topology::operator==, py::is_operator())
      .def("__hash__",
           [](const Topology& t) {
             // What __eq__ compares (the shape; link speeds are not part of equality).
             return py::hash(py::make_tuple(t.num_nodes(), t.num_ranks()));
           })
      .def("__str__", &Topology::to_string)
      .def("__repr__", [](const Topology& t) { return "Topology('" + t.to_string() + "')"; })
      .def(py::pickle(
          [](const Topology& t) {
            return py::make_tuple(t.num_nodes(), t.num_ranks(), t.links().nvlink_bytes_per_s,
                                  t.links().ib_bytes_per_s_per_node);
          },
          [](py::tuple s) {
            COBALT_CHECK_ARG(s.size() == 4,
                             "Topology state: expected (num_nodes, num_ranks, nvlink_bytes_per_s, "
                             "ib_bytes_per_s_per_node), got {} items",
                             s.size());
            try {
              return Topology(s[0].cast<int>(), s[1].cast<int>(),
                              LinkParams{s[2].cast<double>(), s[3].cast<double>()});
            } catch (const py::cast_error&) {
              fail(ErrorCode::kInvalidArgument,
                   "Topology state: expected (int, int, float, float), got {}",
                   std::string(py::repr(s)));
            }
          }));

  m.def("reload_environment", &reload_environment,
        "Reads COBALT_CPU_KERNEL and COBALT_MEMORY_LIMIT again. The library reads them when it "
        "loads, never during a computation (getenv races with os.environ's writes on other "
        "threads); call this after changing them in os.environ.");
  m.def("slots_for_rho", &slots_for_rho, py::arg("num_experts"), py::arg("num_ranks"),
        py::arg("rho"), "Cobalt's budget: slots per rank S = floor((1 + rho) E / G).");
  m.def("slots_for_extra", &slots_for_extra, py::arg("num_experts"), py::arg("num_ranks"),
        py::arg("extra_slots"), "TopoEP's budget: S = ceil(E / G) + extra_slots.");
}

void bind_layout(py::module_& m) {
  py::class_<ReplicaMove>(m, "ReplicaMove")
      .def_readonly("expert", &ReplicaMove::expert)
      .def_readonly("src_rank", &ReplicaMove::src_rank)
      .def_readonly("dst_rank", &ReplicaMove::dst_rank)
      .def_readonly("cross_node", &ReplicaMove::cross_node)
      .def("__repr__", [](const ReplicaMove& r) {
        return fmt::format("ReplicaMove(expert={}, src_rank={}, dst_rank={}, cross_node={})",
                           r.expert, r.src_rank, r.dst_rank, r.cross_node);
      });
  py::class_<LayoutDiff>(m, "LayoutDiff")
      .def_readonly("moves", &LayoutDiff::moves)
      .def_readonly("num_intra_node", &LayoutDiff::num_intra_node)
      .def_readonly("num_cross_node", &LayoutDiff::num_cross_node)
      .def_readonly("num_removed", &LayoutDiff::num_removed);

  py::class_<ExpertLayout, LayoutPtr>(
      m, "ExpertLayout",
      "Replica placement: the expert id in each slot of each rank ([G, S], -1 = empty). Immutable "
      "and validated (every expert has a replica, no rank holds an expert twice).")
      .def(py::init([](const Topology& topology, PyInt num_experts_in, InArray<int32_t> slots) {
             const int num_experts = int_arg(num_experts_in, "num_experts");
             require_ndim(slots, 2, "ExpertLayout slots [G, S]");
             COBALT_CHECK_ARG(slots.shape(0) == topology.num_ranks(),
                              "ExpertLayout: slots has {} rows for {} ranks", slots.shape(0),
                              topology.num_ranks());
             return std::make_shared<ExpertLayout>(
                 topology, num_experts, static_cast<int>(slots.shape(1)), vector_of(slots));
           }),
           py::arg("topology"), py::arg("num_experts"), py::arg("slots"))
      .def_static(
          "from_rank_lists",
          [](const Topology& topology, PyInt num_experts_in, PyInt slots_per_rank_in,
             const std::vector<std::vector<ExpertId>>& lists) {
            const int num_experts = int_arg(num_experts_in, "num_experts");
            const int slots_per_rank = int_arg(slots_per_rank_in, "slots_per_rank");
            return std::make_shared<ExpertLayout>(
                ExpertLayout::from_rank_lists(topology, num_experts, slots_per_rank, lists));
          },
          py::arg("topology"), py::arg("num_experts"), py::arg("slots_per_rank"),
          py::arg("experts_of_rank"))
      .def_static(
          "static_ep",
          [](const Topology& topology, PyInt num_experts_in, PyInt slots_per_rank_in) {
            const int num_experts = int_arg(num_experts_in, "num_experts");
            const int slots_per_rank = int_arg(slots_per_rank_in, "slots_per_rank");
            return std::make_shared<ExpertLayout>(
                ExpertLayout::static_ep(topology, num_experts, slots_per_rank));
          },
          py::arg("topology"), py::arg("num_experts"), py::arg("slots_per_rank"),
          "Static EP: expert e on rank floor(e G / E), one replica each.")
      .def_property_readonly("topology", &ExpertLayout::topology)
      .def_property_readonly("num_experts", &ExpertLayout::num_experts)
      .def_property_readonly("num_ranks", &ExpertLayout::num_ranks)
      .def_property_readonly("num_nodes", &ExpertLayout::num_nodes)
      .def_property_readonly("slots_per_rank", &ExpertLayout::slots_per_rank)
      .def_property_readonly("num_replicas", &ExpertLayout::num_replicas)
      .def_property_readonly(
          "slots",
          [](py::object self) {
            const auto& l = self.cast<const ExpertLayout&>();
            return view_of(l.slots(), {l.num_ranks(), l.slots_per_rank()}, self);
          },
          "[G, S] int32 read-only view: expert id per rank slot, -1 empty.")
      .def(
          "slots_of",
          [](py::object self, RankId rank) {
            const auto& l = self.cast<const ExpertLayout&>();
            COBALT_CHECK_ARG(rank >= 0 && rank < l.num_ranks(), "rank {} out of range [0, {})",
                             rank, l.num_ranks());
            return view_of(l.slots_of(rank), {l.slots_per_rank()}, self);
          },
          py::arg("rank"))
      .def(
          "ranks_of",
          [](py::object self, ExpertId e, std::optional<NodeId> node) {
            const auto& l = self.cast<const ExpertLayout&>();
            COBALT_CHECK_ARG(e >= 0 && e < l.num_experts(), "expert {} out of range [0, {})", e,
                             l.num_experts());
            if (!node.has_value()) {
              auto r = l.ranks_of(e);
              return view_of(r, {static_cast<py::ssize_t>(r.size())}, self);
            }
            COBALT_CHECK_ARG(*node >= 0 && *node < l.num_nodes(), "node {} out of range [0, {})",
                             *node, l.num_nodes());
            auto r = l.ranks_of(e, *node);
            return view_of(r, {static_cast<py::ssize_t>(r.size())}, self);
          },
          py::arg("expert"), py::arg("node") = py::none(),
          "Ranks holding the expert (on `node` when given), ascending.")
      .def(
          "num_replicas_of",
          [](const ExpertLayout& l, ExpertId e) {
            COBALT_CHECK_ARG(e >= 0 && e < l.num_experts(), "expert {} out of range [0, {})", e,
                             l.num_experts());
            return l.num_replicas_of(e);
          },
          py::arg("expert"))
      .def_property_readonly(
          "node_masks",
          [](py::object self) {
            const auto& l = self.cast<const ExpertLayout&>();
            return view_of(l.node_masks(), {l.num_experts()}, self);
          },
          "[E] uint64: bit n set when node n holds the expert.")
      .def(
          "holds",
          [](const ExpertLayout& l, RankId r, ExpertId e) {
            COBALT_CHECK_ARG(r >= 0 && r < l.num_ranks(), "rank {} out of range [0, {})", r,
                             l.num_ranks());
            COBALT_CHECK_ARG(e >= 0 && e < l.num_experts(), "expert {} out of range [0, {})", e,
                             l.num_experts());
            return l.holds(r, e);
          },
          py::arg("rank"), py::arg("expert"))
      .def(
          "num_used_slots",
          [](const ExpertLayout& l, RankId r) {
            COBALT_CHECK_ARG(r >= 0 && r < l.num_ranks(), "rank {} out of range [0, {})", r,
                             l.num_ranks());
            return l.num_used_slots(r);
          },
          py::arg("rank"))
      .def("to_json", &ExpertLayout::to_json)
      .def(
          "__eq__", [](const ExpertLayout& a, const ExpertLayout& b) { return a == b; },
          py::is_operator())
      .def("__repr__",
           [](const ExpertLayout& l) {
             return fmt::format("ExpertLayout(E={}, topology={}, slots_per_rank={}, replicas={})",
                                l.num_experts(), l.topology().to_string(), l.slots_per_rank(),
                                l.num_replicas());
           })
      .def(py::pickle(
          [](py::object self) {
            const auto& l = self.cast<const ExpertLayout&>();
            return py::make_tuple(
                l.topology().num_nodes(), l.num_ranks(), l.num_experts(),
                py::array(view_of(l.slots(), {l.num_ranks(), l.slots_per_rank()}, self))
                    .attr("copy")());
          },
          [](py::tuple s) {
            COBALT_CHECK_ARG(s.size() == 4,
                             "ExpertLayout state: expected (num_nodes, num_ranks, num_experts, "
                             "slots [G, S]), got {} items",
                             s.size());
            InArray<int32_t> slots = s[3].cast<InArray<int32_t>>();
            COBALT_CHECK_ARG(slots.ndim() == 2,
                             "ExpertLayout state: slots must be [G, S], got {} dimension(s)",
                             slots.ndim());
            int sizes[3] = {};
            try {
              for (int i = 0; i < 3; ++i) sizes[i] = s[i].cast<int>();
            } catch (const py::cast_error&) {
              fail(ErrorCode::kInvalidArgument,
                   "ExpertLayout state: num_nodes, num_ranks and num_experts must be integers, "
                   "got {}, {}, {}",
                   std::string(py::repr(s[0])), std::string(py::repr(s[1])),
                   std::string(py::repr(s[2])));
            }
            return std::make_shared<ExpertLayout>(Topology(sizes[0], sizes[1]), sizes[2],
                                                  static_cast<int>(slots.shape(1)),
                                                  vector_of(slots));
          }));

  m.def("diff", &diff, py::arg("from_layout"), py::arg("to_layout"),
        "Replica moves that turn one layout into another (same topology and E).");
}

void bind_routing_batch(py::module_& m) {
  py::class_<PyRoutingBatch>(
      m, "RoutingBatch",
      "One step of one layer's routing: topk_ids [T, K] and source_rank [T] (None: contiguous "
      "blocks per rank), any integer arrays (numpy, torch CPU tensors, lists) whose values fit "
      "int32. The batch keeps its own read-only int32 copy (int64 ids are narrowed into it in "
      "one checked pass), so the caller may change or reuse its arrays. Validated: every row "
      "holds K distinct expert ids in [0, E), every source rank is in [0, G).")
      .def(py::init(&PyRoutingBatch::make), py::arg("topk_ids"),
           py::arg("source_rank") = py::none(), py::arg("num_experts"), py::arg("num_ranks"))
      .def_property_readonly("num_tokens",
                             [](const PyRoutingBatch& b) { return b.batch.num_tokens(); })
      .def_property_readonly("top_k", [](const PyRoutingBatch& b) { return b.batch.top_k(); })
      .def_property_readonly("num_experts",
                             [](const PyRoutingBatch& b) { return b.batch.num_experts(); })
      .def_property_readonly("num_ranks",
                             [](const PyRoutingBatch& b) { return b.batch.num_ranks(); })
      .def_property_readonly("num_tasks",
                             [](const PyRoutingBatch& b) { return b.batch.num_tasks(); })
      .def_readonly("topk_ids", &PyRoutingBatch::topk_ids)
      .def_readonly("source_rank", &PyRoutingBatch::source_rank)
      .def("__len__", [](const PyRoutingBatch& b) { return b.batch.num_tokens(); });

  m.def(
      "validate_assignment",
      [](const PyRoutingBatch& b, const ExpertLayout& layout, InArray<int32_t> exec_rank) {
        // From Python the assignment is the caller's input (a layout source, say): a bad one is
        // an invalid argument, not an internal error of the library.
        COBALT_CHECK_ARG(exec_rank.size() == b.batch.num_tasks(),
                         "exec_rank holds {} ranks, the batch has {} tasks", exec_rank.size(),
                         b.batch.num_tasks());
        try {
          validate_assignment(b.batch, layout, span_of(exec_rank));
        } catch (const Error& error) {
          fail(ErrorCode::kInvalidArgument, "{}", error.what());
        }
      },
      py::arg("batch"), py::arg("layout"), py::arg("exec_rank"),
      "Raises InvalidArgumentError (a ValueError) naming the first task whose rank does not hold "
      "its expert, or when the sizes disagree.");
  m.def(
      "contiguous_source_ranks",
      [](PyInt num_tokens_in, PyInt num_ranks_in) {
        const int64_t num_tokens = int64_arg(num_tokens_in, "num_tokens");
        const int num_ranks = int_arg(num_ranks_in, "num_ranks");
        COBALT_CHECK_ARG(num_tokens >= 0, "number of tokens {} must be >= 0", num_tokens);
        COBALT_CHECK_ARG(num_ranks >= 1, "number of ranks {} must be >= 1", num_ranks);
        require_memory(4.0 * static_cast<double>(num_tokens),
                       fmt::format("contiguous_source_ranks: [T] int32 for {} tokens", num_tokens),
                       "ask for fewer tokens");
        std::vector<RankId> out(static_cast<size_t>(num_tokens));
        contiguous_source_ranks(num_tokens, num_ranks, out);
        return owned_array(std::move(out), {static_cast<py::ssize_t>(num_tokens)});
      },
      py::arg("num_tokens"), py::arg("num_ranks"),
      "[T] int32: token i of T comes from rank floor(i G / T).");
}

}  // namespace

void bind_core(py::module_& m) {
  m.attr("EMPTY_SLOT") = kEmptySlot;
  m.attr("MAX_NODES") = kMaxNodes;
  bind_topology(m);
  bind_layout(m);
  bind_routing_batch(m);
}

}  // namespace cobalt::py_bindings
