#include "report_charts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "svg.hpp"

namespace cobalt::eval::charts {
namespace {

// An SVG that only says why the chart is missing.
std::string unavailable(const std::string& name, const std::string& why) {
  return svg::open(name, 640, 60, why) + svg::text(10, 34, why, "class=\"note\"") + "</svg>";
}

// Policy names in their colours, in one row at (x, y).
std::string legend(const SimulationResult& r, double x, double y) {
  std::string out;
  for (size_t i = 0; i < r.policies.size(); ++i) {
    if (!r.policies[i].skipped.empty()) continue;
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/>",
                       x, y - 9, svg::category_color(static_cast<int>(i)));
    out += svg::text(x + 14, y, r.policies[i].name);
    x += 24 + 7.0 * r.policies[i].name.size();
  }
  return out;
}

}  // namespace

std::string pareto(const SimulationResult& r) {
  if (r.load_only) {
    return unavailable("pareto", "cross-node transfers need per-token routing (load-only trace)");
  }
  struct Point {
    double v, imb;
    int idx;
  };
  std::vector<Point> pts;
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const auto& p = r.policies[i];
    // Non-finite values (none in a valid replay) are left out rather than drawn off the chart.
    if (p.skipped.empty() && std::isfinite(p.imbalance_mean)) {
      pts.push_back(
          {static_cast<double>(p.cross_node_tokens), p.imbalance_mean, static_cast<int>(i)});
    }
  }
  if (pts.empty()) return unavailable("pareto", "no policy ran");
  svg::Frame f{80, 20, 520, 300, 0, 1, 1, 1.1};
  for (const auto& p : pts) {
    f.x1 = std::max(f.x1, p.v * 1.08);
    f.y0 = std::min(f.y0, p.imb);
    f.y1 = std::max(f.y1, p.imb + 0.05 * (p.imb - 1) + 0.02);
  }
  std::string out = svg::open("pareto", 760, 380, "cross-node tokens vs imbalance");
  out += svg::axes(f, "cross-node token transfers (node dedup, measured steps)",
                   "imbalance (mean max/mean rank load)");
  // Pareto front: sorted by transfers, keep the points that lower the best imbalance so far.
  std::vector<Point> sorted = pts;
  std::sort(sorted.begin(), sorted.end(), [](const Point& a, const Point& b) {
    return a.v < b.v || (a.v == b.v && a.imb < b.imb);
  });
  std::string path;
  double best = 1e300;
  for (const auto& p : sorted) {
    if (p.imb >= best) continue;
    if (path.empty()) {
      path = fmt::format("M{:.1f},{:.1f}", f.px(p.v), f.top);
    } else {
      path += fmt::format(" H{:.1f}", f.px(p.v));
    }
    path += fmt::format(" V{:.1f}", f.py(p.imb));
    best = p.imb;
  }
  path += fmt::format(" H{:.1f}", f.left + f.width);
  out += fmt::format(
      "<path d=\"{}\" fill=\"none\" stroke=\"#555\" stroke-dasharray=\"5,4\" "
      "class=\"front\"/>",
      path);
  for (const auto& p : pts) {
    const auto& pol = r.policies[p.idx];
    out += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"6\" fill=\"{}\" stroke=\"#222\"><title>{}: {} "
        "cross-node tokens, imbalance {:.3f}</title></circle>",
        f.px(p.v), f.py(p.imb), svg::category_color(p.idx), svg::esc(pol.name),
        pol.cross_node_tokens, pol.imbalance_mean);
    out += svg::text(f.px(p.v) + 9, f.py(p.imb) - 7, pol.name, "class=\"label\"");
  }
  out +=
      svg::text(f.left + f.width + 8, f.top + f.height - 4, "better: lower-left", "class=\"note\"");
  return out + "</svg>";
}

std::string per_step(const SimulationResult& r, StepMetric metric) {
  const char* names[] = {"steps-cross-node", "steps-imbalance", "steps-time"};
  const char* titles[] = {"cross-node token transfers per step (all layers)",
                          "imbalance per step (mean over layers)",
                          "modelled step time per step (cost model)"};
  const char* y_titles[] = {"tokens", "max/mean rank load", "ms (modelled)"};
  const int m = static_cast<int>(metric);
  if (r.load_only && metric != StepMetric::kImbalance) {
    return unavailable(names[m], "needs per-token routing (load-only trace)");
  }
  auto value = [&](const PolicyResult& p, int s) {
    switch (metric) {
      case StepMetric::kCrossNodeTokens:
        return static_cast<double>(p.step_cross_node_tokens[s]);
      case StepMetric::kImbalance:
        return p.step_imbalance[s];
      default:
        return 1e3 * p.step_time_s[s];
    }
  };
  svg::Frame f{80, 48, 560, 180, 0, std::max(1.0, r.num_steps - 1.0), 0, 0};
  f.integer_x = true;
  f.y0 = metric == StepMetric::kImbalance ? 1.0 : 0.0;
  f.y1 = f.y0;
  for (const auto& p : r.policies) {
    if (!p.skipped.empty()) continue;
    for (int s = 0; s < r.num_steps; ++s) {
      if (std::isfinite(value(p, s))) f.y1 = std::max(f.y1, value(p, s));
    }
  }
  if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
  std::string out = svg::open(names[m], 760, 280, titles[m]);
  out += svg::text(f.left, 14, titles[m], "class=\"title\"");
  out += svg::axes(f, "step", y_titles[m]);
  if (r.first_measured_step > 0) {
    const double x_end = f.px(std::min<double>(r.first_measured_step - 0.5, f.x1));
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#000\" "
        "fill-opacity=\"0.06\"/>",
        f.left, f.top, std::max(0.0, x_end - f.left), f.height);
    out += svg::text(f.left + 4, f.top + f.height - 5, "not measured", "class=\"note\"");
  }
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const auto& p = r.policies[i];
    if (!p.skipped.empty()) continue;
    std::string pts;
    for (int s = 0; s < r.num_steps; ++s) {
      if (!std::isfinite(value(p, s))) continue;  // a step without tasks has no imbalance
      pts += fmt::format("{:.1f},{:.1f} ", f.px(s), f.py(value(p, s)));
    }
    const std::string color = svg::category_color(static_cast<int>(i));
    out += fmt::format(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"><title>{}</title>"
        "</polyline>",
        pts, color, svg::esc(p.name));
    if (r.num_steps <= 60) {
      for (int s = 0; s < r.num_steps; ++s) {
        if (!std::isfinite(value(p, s))) continue;
        out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>", f.px(s),
                           f.py(value(p, s)), color);
      }
    }
  }
  out += legend(r, f.left, 34);
  return out + "</svg>";
}

std::string ochiai_heatmap(const ReportExtras& x, const ExpertLayout* layout) {
  const int num_experts = static_cast<int>(x.expert_load.size());
  if (x.coactivation.empty() || num_experts == 0) {
    return unavailable("ochiai", "co-activation needs per-token routing (load-only trace)");
  }
  // Expert order: grouped by node under `layout` (an expert held on one node belongs to it; one
  // held on several joins the node whose single-node experts it co-activates with most), then by
  // rank and id.
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> node_of(num_experts, -1);
  if (layout) {
    const Topology& topo = layout->topology();
    std::vector<int> key(num_experts, 0);
    for (int e = 0; e < num_experts; ++e) {
      const uint64_t mask = layout->node_mask(e);
      if ((mask & (mask - 1)) == 0) {
        node_of[e] = std::countr_zero(mask);
        key[e] = layout->ranks_of(e).front();
      }
    }
    for (int e = 0; e < num_experts; ++e) {
      if (node_of[e] >= 0) continue;
      std::vector<double> affinity(topo.num_nodes(), 0.0);
      for (int j = 0; j < num_experts; ++j) {
        if (node_of[j] >= 0) {
          affinity[node_of[j]] += x.coactivation[static_cast<size_t>(e) * num_experts + j];
        }
      }
      int best = -1;
      for (int n = 0; n < topo.num_nodes(); ++n) {
        if ((layout->node_mask(e) >> n & 1) && (best < 0 || affinity[n] > affinity[best])) best = n;
      }
      node_of[e] = best;
      key[e] = layout->ranks_of(e, best).front();
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  }
  const int block = (num_experts + 127) / 128;
  const int n = (num_experts + block - 1) / block;
  std::vector<double> cell(static_cast<size_t>(n) * n, 0.0);
  std::vector<double> weight(cell.size(), 0.0);
  for (int a = 0; a < num_experts; ++a) {
    for (int b = 0; b < num_experts; ++b) {
      if (a == b) continue;
      const int i = order[a], j = order[b];
      const double wi = x.expert_load[i], wj = x.expert_load[j];
      const double o = wi > 0 && wj > 0 ? x.coactivation[static_cast<size_t>(i) * num_experts + j] /
                                              std::sqrt(wi * wj)
                                        : 0.0;
      const size_t c = static_cast<size_t>(a / block) * n + b / block;
      cell[c] += o;
      weight[c] += 1;
    }
  }
  double vmax = 0;
  for (size_t c = 0; c < cell.size(); ++c) {
    if (weight[c] > 0) cell[c] /= weight[c];
    if (c / n != c % n) vmax = std::max(vmax, cell[c]);
  }
  if (vmax <= 0) vmax = 1;
  const double size = 480, step = size / n, left = 50, top = 30;
  std::string out = svg::open("ochiai", 680, 560, "co-activation heatmap");
  out += svg::text(left, 18,
                   fmt::format("layer {}: Ochiai(i, j) = c_ij / sqrt(w_i w_j){}", x.layer,
                               block > 1 ? fmt::format(", blocks of {} experts", block) : ""),
                   "class=\"title\"");
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#fff\" "
      "stroke=\"#888\"/>",
      left, top, size, size);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double v = cell[static_cast<size_t>(i) * n + j];
      const bool diag = i == j && block == 1;
      if (!diag && v < 0.02 * vmax) continue;
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>",
          left + j * step, top + i * step, step + 0.05, step + 0.05,
          diag ? "#d0d0d0" : svg::heat_color(v / vmax));
    }
  }
  if (layout) {
    for (int a = 1; a < num_experts; ++a) {
      if (node_of[order[a]] == node_of[order[a - 1]]) continue;
      const double p = left + static_cast<double>(a) / block * step;
      const double q = top + static_cast<double>(a) / block * step;
      out += fmt::format(
          "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#e15759\"/>"
          "<line x1=\"{3:.1f}\" x2=\"{4:.1f}\" y1=\"{5:.1f}\" y2=\"{5:.1f}\" stroke=\"#e15759\"/>",
          p, top, top + size, left, left + size, q);
    }
  }
  // Colour legend.
  const double lx = left + size + 30;
  for (int k = 0; k < 20; ++k) {
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"12\" fill=\"{}\"/>",
                       lx, top + size - (k + 1) * 12.0, svg::heat_color((k + 0.5) / 20));
  }
  out += svg::text(lx + 20, top + size, "0");
  out += svg::text(lx + 20, top + size - 236, fmt::format("{:.3f}", vmax));
  out += svg::text(left, top + size + 20,
                   layout ? "experts grouped by node under the best policy's layout (red lines: "
                            "node boundaries)"
                          : "experts in id order",
                   "class=\"note\"");
  return out + "</svg>";
}

std::string layout_grid(const ExpertLayout& layout, const ReportExtras& x,
                        const std::string& policy) {
  const Topology& topo = layout.topology();
  const int per_node = topo.ranks_per_node(), slots = layout.slots_per_rank();
  const double cw = 30, ch = 18, label_w = 44, gap = 24;
  const double panel_w = label_w + slots * cw, panel_h = 22 + per_node * ch;
  const int per_row = std::max(1, static_cast<int>(1180 / (panel_w + gap)));
  const int rows = (topo.num_nodes() + per_row - 1) / per_row;
  const double width = std::max(640.0, per_row * (panel_w + gap));
  const double height = 40 + rows * (panel_h + gap);
  double max_load = 0;
  for (double w : x.expert_load) max_load = std::max(max_load, w);
  std::string out = svg::open("layout", width, height, "expert layout grid");
  out += svg::text(0, 16,
                   fmt::format("{}: layout of layer {} after the last step (nodes x ranks x "
                               "slots; shade = expert load, red outline = replicated expert)",
                               policy, x.layer),
                   "class=\"title\"");
  for (NodeId n = 0; n < topo.num_nodes(); ++n) {
    const double px = (n % per_row) * (panel_w + gap), py = 32 + (n / per_row) * (panel_h + gap);
    out += svg::text(px + label_w, py + 12, fmt::format("node {}", n), "class=\"label\"");
    for (int i = 0; i < per_node; ++i) {
      const RankId r = topo.first_rank_of(n) + i;
      const double y = py + 18 + i * ch;
      out += svg::text(px + label_w - 4, y + 13, fmt::format("r{}", r), "text-anchor=\"end\"");
      const auto row = layout.slots_of(r);
      for (int s = 0; s < slots; ++s) {
        const ExpertId e = row[s];
        const double cx = px + label_w + s * cw;
        if (e == kEmptySlot) {
          out += fmt::format(
              "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
              "fill=\"#f4f4f4\" stroke=\"#ddd\"/>",
              cx, y, cw, ch);
          continue;
        }
        const double share = max_load > 0 && e < static_cast<int>(x.expert_load.size())
                                 ? x.expert_load[e] / max_load
                                 : 0.0;
        const double shade = 0.1 + 0.8 * share;
        const bool replicated = layout.num_replicas_of(e) > 1;
        out += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
            "stroke=\"{}\" stroke-width=\"{}\"><title>expert {} ({} replicas)</title></rect>",
            cx, y, cw, ch, svg::heat_color(shade), replicated ? "#e15759" : "#fff",
            replicated ? 2 : 1, e, layout.num_replicas_of(e));
        out += svg::text(cx + cw / 2, y + 13, std::to_string(e),
                         fmt::format("text-anchor=\"middle\" class=\"cell\" fill=\"{}\"",
                                     shade > 0.55 ? "#fff" : "#222"));
      }
    }
  }
  return out + "</svg>";
}

std::string time_breakdown(const SimulationResult& r) {
  struct Part {
    const char* name;
    const char* color;
    double TimeBreakdown::*field;
  };
  const Part parts[] = {{"compute", "#4e79a7", &TimeBreakdown::compute_s},
                        {"exchange", "#f28e2b", &TimeBreakdown::exchange_s},
                        {"grad sync", "#59a14f", &TimeBreakdown::grad_sync_s},
                        {"migration", "#e15759", &TimeBreakdown::migration_s},
                        {"planning", "#b07aa1", &TimeBreakdown::planning_s}};
  std::vector<int> ran;
  double max_total = 0;
  for (size_t i = 0; i < r.policies.size(); ++i) {
    if (!r.policies[i].skipped.empty()) continue;
    ran.push_back(static_cast<int>(i));
    if (std::isfinite(r.policies[i].time.total())) {
      max_total = std::max(max_total, r.policies[i].time.total());
    }
  }
  if (ran.empty()) return unavailable("breakdown", "no policy ran");
  if (max_total <= 0) max_total = 1;
  const double left = 120, bar_w = 520, bar_h = 22, top = 40;
  std::string out =
      svg::open("breakdown", 760, top + ran.size() * (bar_h + 8) + 30, "modelled time breakdown");
  double lx = left;
  for (const auto& part : parts) {
    out += fmt::format("<rect x=\"{:.1f}\" y=\"8\" width=\"10\" height=\"10\" fill=\"{}\"/>", lx,
                       part.color);
    out += svg::text(lx + 14, 17, part.name);
    lx += 28 + 7.0 * std::string(part.name).size();
  }
  for (size_t k = 0; k < ran.size(); ++k) {
    const auto& p = r.policies[ran[k]];
    const double y = top + k * (bar_h + 8);
    out += svg::text(left - 8, y + 15, p.name, "text-anchor=\"end\" class=\"label\"");
    double x = left;
    for (const auto& part : parts) {
      const double v = p.time.*part.field;
      const double w = std::min(v / max_total * bar_w, bar_w);
      if (!(w > 0)) continue;  // also NaN
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{}: {:.3f} ms</title></rect>",
          x, y, w, bar_h, part.color, part.name, 1e3 * v);
      x += w;
    }
    out += svg::text(x + 6, y + 15, fmt::format("{:.2f} ms", 1e3 * p.time.total()));
  }
  out +=
      svg::text(left, top + ran.size() * (bar_h + 8) + 16,
                "modelled seconds per measured step (cost model, not measured)", "class=\"note\"");
  return out + "</svg>";
}

}  // namespace cobalt::eval::charts
