// Internal: small helpers to write SVG charts as strings (escaping, number formatting, axis ticks,
// colours, a plot frame mapping data to pixels).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cobalt::eval::svg {

// XML-escapes &, <, >, " and '.
std::string esc(std::string_view text);
// Compact number: up to 4 significant digits, SI suffix (k, M, G) for large magnitudes.
std::string si(double value);
// About `target` round tick values covering [lo, hi] (whole numbers when `integer`).
std::vector<double> ticks(double lo, double hi, int target = 5, bool integer = false);
// Categorical colour i (Tableau 10, cycling).
std::string category_color(int i);
// Sequential colour for v in [0, 1]: white -> deep blue.
std::string heat_color(double v);

// A plot area: data range [x0, x1] x [y0, y1] drawn into the pixel box (left, top, width, height).
struct Frame {
  double left = 60, top = 20, width = 400, height = 200;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool integer_x = false;  // whole-number ticks on x (e.g. steps)
  double px(double x) const { return left + (x - x0) / (x1 - x0) * width; }
  double py(double y) const { return top + height - (y - y0) / (y1 - y0) * height; }
};
// Grid lines, tick labels and axis titles of `frame` (ticks from ticks()); widens the data range
// to the outer ticks (y always, x unless integer_x).
std::string axes(Frame& frame, const std::string& x_title, const std::string& y_title);
// <svg data-chart="NAME" ...> opening tag with a viewBox of width x height.
std::string open(const std::string& name, double width, double height, const std::string& label);
// <text> at (x, y) with extra attributes.
std::string text(double x, double y, const std::string& content, const std::string& attrs = "");

}  // namespace cobalt::eval::svg
