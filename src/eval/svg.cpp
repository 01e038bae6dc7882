#include "svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace cobalt::eval::svg {

std::string esc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string si(double value) {
  const double a = std::abs(value);
  if (a >= 1e9) return fmt::format("{:.4g}G", value / 1e9);
  if (a >= 1e6) return fmt::format("{:.4g}M", value / 1e6);
  if (a >= 1e4) return fmt::format("{:.4g}k", value / 1e3);
  return fmt::format("{:.4g}", value);
}

std::vector<double> ticks(double lo, double hi, int target, bool integer) {
  // Non-finite or huge bounds (a chart of overflowed values) still give a short, finite axis: the
  // span hi - lo must stay finite, and a step must move t (at 1e17, +0.2 is lost to rounding).
  constexpr double kLimit = 1e300;
  constexpr size_t kMaxTicks = 1000;
  lo = std::isfinite(lo) ? std::clamp(lo, -kLimit, kLimit) : 0.0;
  hi = std::isfinite(hi) ? std::clamp(hi, -kLimit, kLimit) : lo + 1;
  if (!(hi > lo)) hi = lo + std::max(1.0, std::abs(lo) * 1e-6);
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (integer && m == 2.5 && mag < 10) continue;
    step = m * mag;
    if (step >= raw) break;
  }
  if (integer) step = std::max(1.0, std::round(step));
  std::vector<double> out;
  for (double t = std::floor(lo / step) * step; t <= hi + 1e-9 * step && out.size() < kMaxTicks;
       t += step) {
    out.push_back(std::abs(t) < 1e-12 * step ? 0.0 : t);
    if (t + step == t) break;  // the step is below t's precision
  }
  if (out.empty()) out.push_back(lo);
  if (out.back() < hi - 1e-9 * step) out.push_back(std::max(out.back() + step, hi));
  return out;
}

std::string category_color(int i) {
  static const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kColors[((i % 10) + 10) % 10];
}

std::string heat_color(double v) {
  v = std::clamp(v, 0.0, 1.0);
  // White (255, 255, 255) -> light blue (158, 202, 225) -> deep blue (8, 48, 107).
  auto mix = [](double a, double b, double t) { return static_cast<int>(a + (b - a) * t + 0.5); };
  int r, g, b;
  if (v < 0.5) {
    const double t = v / 0.5;
    r = mix(255, 158, t), g = mix(255, 202, t), b = mix(255, 225, t);
  } else {
    const double t = (v - 0.5) / 0.5;
    r = mix(158, 8, t), g = mix(202, 48, t), b = mix(225, 107, t);
  }
  return fmt::format("#{:02x}{:02x}{:02x}", r, g, b);
}

std::string axes(Frame& f, const std::string& x_title, const std::string& y_title) {
  auto xt = ticks(f.x0, f.x1, 5, f.integer_x);
  const auto yt = ticks(f.y0, f.y1);
  if (f.integer_x) {
    // Whole-number axes (steps) keep their exact range; ticks outside it are dropped.
    std::erase_if(xt, [&](double t) { return t < f.x0 || t > f.x1; });
  } else {
    f.x0 = xt.front();
    f.x1 = xt.back();
  }
  f.y0 = yt.front();
  f.y1 = yt.back();
  std::string out = "<g class=\"axes\">";
  for (double t : yt) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e3e3\"/>",
        f.left, f.left + f.width, f.py(t), f.py(t));
    out += text(f.left - 6, f.py(t) + 4, si(t), "text-anchor=\"end\"");
  }
  for (double t : xt) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e3e3\"/>",
        f.px(t), f.px(t), f.top, f.top + f.height);
    out += text(f.px(t), f.top + f.height + 15, si(t), "text-anchor=\"middle\"");
  }
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#888\"/>",
      f.left, f.top, f.width, f.height);
  out += text(f.left + f.width / 2, f.top + f.height + 32, x_title,
              "text-anchor=\"middle\" class=\"title\"");
  out += text(14, f.top + f.height / 2, y_title,
              fmt::format("text-anchor=\"middle\" class=\"title\" transform=\"rotate(-90 14 "
                          "{:.1f})\"",
                          f.top + f.height / 2));
  return out + "</g>";
}

std::string open(const std::string& name, double width, double height, const std::string& label) {
  return fmt::format(
      "<svg data-chart=\"{}\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" role=\"img\" aria-label=\"{}\">",
      esc(name), width, height, width, height, esc(label));
}

std::string text(double x, double y, const std::string& content, const std::string& attrs) {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" {}>{}</text>", x, y, attrs, esc(content));
}

}  // namespace cobalt::eval::svg
