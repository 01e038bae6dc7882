// io/: cobalt-trace v1 (TraceData, write_trace, TraceReader) and trace statistics of either.
#include <pybind11/stl.h>

#include <map>
#include <optional>

#include "bindings_common.hpp"
#include "cobalt/eval/trace_stats.hpp"
#include "cobalt/io/trace.hpp"

namespace cobalt::py_bindings {
namespace {

using io::TraceData;
using io::TraceReader;

// TraceData from arrays: topk_ids [L, T, K] (token trace) or counts [S, L, R, E] (load-only).
TraceData make_trace_data(int num_experts, std::optional<InArray<int32_t>> topk_ids,
                          std::optional<InArray<int64_t>> step_offsets,
                          std::optional<InArray<int32_t>> source_rank, int num_sources,
                          std::optional<InArray<int32_t>> counts,
                          std::map<std::string, std::string> metadata) {
  TraceData d;
  d.num_experts = num_experts;
  d.num_sources = num_sources;
  d.metadata = std::move(metadata);
  COBALT_CHECK_ARG(topk_ids.has_value() != counts.has_value(),
                   "TraceData: give exactly one of topk_ids [L, T, K] and counts [S, L, R, E]");
  if (topk_ids.has_value()) {
    require_ndim(*topk_ids, 3, "TraceData topk_ids [L, T, K]");
    d.num_layers = static_cast<int>(topk_ids->shape(0));
    d.num_tokens = topk_ids->shape(1);
    d.top_k = static_cast<int>(topk_ids->shape(2));
    d.topk_ids = vector_of(*topk_ids);
  } else {
    require_ndim(*counts, 4, "TraceData counts [S, L, R, E]");
    COBALT_CHECK_ARG(counts->shape(3) == num_experts,
                     "TraceData: counts has {} experts in its last dimension, num_experts is {}",
                     counts->shape(3), num_experts);
    d.num_count_steps = static_cast<int>(counts->shape(0));
    d.num_layers = static_cast<int>(counts->shape(1));
    if (d.num_sources == 0) d.num_sources = static_cast<int>(counts->shape(2));
    COBALT_CHECK_ARG(d.num_sources == counts->shape(2),
                     "TraceData: counts has {} sources, num_sources is {}", counts->shape(2),
                     d.num_sources);
    d.counts = vector_of(*counts);
    auto it = d.metadata.find("top_k");
    COBALT_CHECK_ARG(it == d.metadata.end(), "TraceData: give top_k as an argument, not metadata");
  }
  if (step_offsets.has_value()) d.step_offsets = vector_of(*step_offsets);
  if (source_rank.has_value()) d.source_rank = vector_of(*source_rank);
  return d;
}

template <typename T>
py::array vector_view(py::object self, const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  return view_of(std::span<const T>(v), std::move(shape), self);
}

// A span from the reader: a zero-copy view when it points into the mapping, else an owned copy of
// the scratch buffer.
template <typename T>
py::array reader_span(py::object reader, std::span<const T> span, std::vector<T>& scratch,
                      std::vector<py::ssize_t> shape) {
  if (!scratch.empty() && span.data() == scratch.data()) {
    std::vector<T> own(span.begin(), span.end());
    return owned_array(std::move(own), std::move(shape));
  }
  return view_of(span, std::move(shape), reader);
}

}  // namespace

void bind_io(py::module_& m) {
  py::class_<TraceData>(
      m, "TraceData",
      "An in-memory cobalt-trace v1: topk_ids [L, T, K], step_offsets [S + 1], source_rank [T] "
      "(optional), or counts [S, L, R, E] for a load-only trace; metadata is a str -> str map.")
      // A token trace (the load-only form below takes top_k, which this one reads from the ids).
      .def(py::init([](PyInt num_experts_in, InArray<int32_t> topk_ids,
                       std::optional<InArray<int64_t>> step_offsets,
                       std::optional<InArray<int32_t>> source_rank, PyInt num_sources_in,
                       std::map<std::string, std::string> metadata) {
             const int num_experts = int_arg(num_experts_in, "num_experts");
             const int num_sources = int_arg(num_sources_in, "num_sources");
             return make_trace_data(num_experts, std::move(topk_ids), std::move(step_offsets),
                                    std::move(source_rank), num_sources, std::nullopt,
                                    std::move(metadata));
           }),
           py::arg("num_experts"), py::arg("topk_ids"), py::arg("step_offsets") = py::none(),
           py::arg("source_rank") = py::none(), py::arg("num_sources") = 0,
           py::arg("metadata") = std::map<std::string, std::string>{},
           "Token trace from topk_ids [L, T, K].")
      .def(py::init([](PyInt num_experts_in, PyInt top_k_in, InArray<int32_t> counts,
                       PyInt num_sources_in, std::map<std::string, std::string> metadata) {
             const int num_experts = int_arg(num_experts_in, "num_experts");
             const int top_k = int_arg(top_k_in, "top_k");
             const int num_sources = int_arg(num_sources_in, "num_sources");
             TraceData d = make_trace_data(num_experts, std::nullopt, std::nullopt, std::nullopt,
                                           num_sources, std::move(counts), std::move(metadata));
             d.top_k = top_k;
             return d;
           }),
           py::arg("num_experts"), py::arg("top_k"), py::arg("counts"), py::arg("num_sources") = 0,
           py::arg("metadata") = std::map<std::string, std::string>{},
           "Load-only trace from counts [S, L, R, E].")
      .def_readonly("num_experts", &TraceData::num_experts)
      .def_readonly("top_k", &TraceData::top_k)
      .def_readonly("num_layers", &TraceData::num_layers)
      .def_readonly("num_tokens", &TraceData::num_tokens)
      .def_readonly("num_sources", &TraceData::num_sources)
      .def_readonly("num_count_steps", &TraceData::num_count_steps)
      .def_readwrite("metadata", &TraceData::metadata)
      .def_property_readonly(
          "topk_ids",
          [](py::object self) {
            const auto& d = self.cast<const TraceData&>();
            if (d.topk_ids.empty()) return py::array(py::array_t<int32_t>(0));
            return vector_view(self, d.topk_ids, {d.num_layers, d.num_tokens, d.top_k});
          })
      .def_property_readonly("step_offsets",
                             [](py::object self) {
                               const auto& d = self.cast<const TraceData&>();
                               return vector_view(
                                   self, d.step_offsets,
                                   {static_cast<py::ssize_t>(d.step_offsets.size())});
                             })
      .def_property_readonly("source_rank",
                             [](py::object self) {
                               const auto& d = self.cast<const TraceData&>();
                               return vector_view(self, d.source_rank,
                                                  {static_cast<py::ssize_t>(d.source_rank.size())});
                             })
      .def_property_readonly("counts", [](py::object self) {
        const auto& d = self.cast<const TraceData&>();
        if (d.counts.empty()) return py::array(py::array_t<int32_t>(0));
        return vector_view(self, d.counts,
                           {d.num_count_steps, d.num_layers, d.num_sources, d.num_experts});
      });

  m.def(
      "validate_trace_data",
      [](const TraceData& d, const std::string& context) { io::validate_trace_data(d, context); },
      py::arg("data"), py::arg("context") = "trace");
  m.def(
      "write_trace",
      [](const std::string& path, const TraceData& d) {
        // `metadata` is the one field Python can replace (the arrays are read-only views): copy
        // it while the GIL is held, so another thread's assignment cannot free the map in use.
        const std::map<std::string, std::string> metadata = d.metadata;
        py::gil_scoped_release release;
        io::write_trace(path, d, metadata);
      },
      py::arg("path"), py::arg("data"),
      "Validates and writes cobalt-trace v1 atomically (temporary file + rename).");

  py::class_<TraceReader>(
      m, "TraceReader",
      "A memory-mapped, fully validated cobalt-trace v1 file; topk_ids/source_rank/counts "
      "return zero-copy read-only views where the file's dtype allows it.")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release release;
             return std::make_unique<TraceReader>(path);
           }),
           py::arg("path"))
      .def_property_readonly("path", &TraceReader::path)
      .def_property_readonly("num_experts", &TraceReader::num_experts)
      .def_property_readonly("top_k", &TraceReader::top_k)
      .def_property_readonly("num_layers", &TraceReader::num_layers)
      .def_property_readonly("num_tokens", &TraceReader::num_tokens)
      .def_property_readonly("num_steps", &TraceReader::num_steps)
      .def_property_readonly("has_token_ids", &TraceReader::has_token_ids)
      .def_property_readonly("has_source_rank", &TraceReader::has_source_rank)
      .def_property_readonly("has_counts", &TraceReader::has_counts)
      .def_property_readonly("num_sources", &TraceReader::num_sources)
      .def_property_readonly("metadata", &TraceReader::metadata)
      .def_property_readonly("step_offsets",
                             [](py::object self) {
                               const auto& r = self.cast<const TraceReader&>();
                               auto s = r.step_offsets();
                               return view_of(s, {static_cast<py::ssize_t>(s.size())}, self);
                             })
      .def(
          "topk_ids",
          [](py::object self, PyInt layer_in, PyInt begin_in, std::optional<PyInt> end_in) {
            const int layer = int_arg(layer_in, "layer");
            const int64_t begin = int64_arg(begin_in, "begin");
            const std::optional<int64_t> end = int64_arg(end_in, "end");
            const auto& r = self.cast<const TraceReader&>();
            const int64_t stop = end.value_or(r.num_tokens());
            std::vector<ExpertId> scratch;
            auto span = r.topk_ids(layer, begin, stop, scratch);
            return reader_span(self, span, scratch, {stop - begin, r.top_k()});
          },
          py::arg("layer"), py::arg("begin") = 0, py::arg("end") = py::none(),
          "Expert ids of `layer`, tokens [begin, end): [end - begin, K] int32.")
      .def(
          "source_rank",
          [](py::object self, PyInt begin_in, std::optional<PyInt> end_in) {
            const int64_t begin = int64_arg(begin_in, "begin");
            const std::optional<int64_t> end = int64_arg(end_in, "end");
            const auto& r = self.cast<const TraceReader&>();
            const int64_t stop = end.value_or(r.num_tokens());
            std::vector<RankId> scratch;
            auto span = r.source_rank(begin, stop, scratch);
            return reader_span(self, span, scratch, {stop - begin});
          },
          py::arg("begin") = 0, py::arg("end") = py::none())
      .def(
          "counts",
          [](py::object self, PyInt step_in, PyInt layer_in) {
            const int step = int_arg(step_in, "step");
            const int layer = int_arg(layer_in, "layer");
            const auto& r = self.cast<const TraceReader&>();
            std::vector<int32_t> scratch;
            auto span = r.counts(step, layer, scratch);
            return reader_span(self, span, scratch, {r.num_sources(), r.num_experts()});
          },
          py::arg("step"), py::arg("layer"), "Load-only traces: counts of (step, layer) [R, E].")
      .def("load", &TraceReader::load, "Everything in memory as a TraceData.");

  m.def(
      "compute_trace_stats",
      [](const TraceReader& r, const eval::TraceStatsOptions& o) {
        py::gil_scoped_release release;
        return eval::compute_trace_stats(r, o);
      },
      py::arg("trace"), py::arg("options") = eval::TraceStatsOptions{});
  m.def(
      "compute_trace_stats",
      [](const TraceData& d, const eval::TraceStatsOptions& o) {
        py::gil_scoped_release release;
        return eval::compute_trace_stats(d, o);
      },
      py::arg("trace"), py::arg("options") = eval::TraceStatsOptions{});
}

}  // namespace cobalt::py_bindings
