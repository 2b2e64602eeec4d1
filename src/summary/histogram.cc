#include "summary/histogram.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace ember::summary {
namespace {

std::vector<double> MakeDefaultBucketLimits() {
  std::vector<double> pos;
  for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) pos.push_back(v);
  pos.push_back(DBL_MAX);
  std::vector<double> limits;
  limits.reserve(2 * pos.size() + 1);
  for (auto it = pos.rbegin(); it != pos.rend(); ++it) limits.push_back(-*it);
  limits.push_back(0.0);
  limits.insert(limits.end(), pos.begin(), pos.end());
  return limits;
}

}  // namespace

const std::vector<double>& DefaultBucketLimits() {
  static const std::vector<double> limits = MakeDefaultBucketLimits();
  return limits;
}

bool BuildHistogram(std::span<const double> values, Histogram* out) {
  const std::vector<double>& limits = DefaultBucketLimits();
  std::vector<double> counts(limits.size(), 0.0);
  Histogram h;
  h.min = DBL_MAX;
  h.max = -DBL_MAX;
  for (double v : values) {
    if (!std::isfinite(v)) return false;
    // Bucket i holds [limits[i-1], limits[i]); the last one also DBL_MAX itself.
    size_t b = std::upper_bound(limits.begin(), limits.end(), v) - limits.begin();
    counts[std::min(b, limits.size() - 1)] += 1.0;
    h.min = std::min(h.min, v);
    h.max = std::max(h.max, v);
    h.sum += v;
    h.sum_squares += v * v;
  }
  h.num = static_cast<double>(values.size());
  for (size_t i = 0; i < counts.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count <= 0.0) {  // a run of empty buckets becomes one
      while (i < counts.size() && counts[i] <= 0.0) {
        end = limits[i];
        ++i;
      }
    }
    h.bucket_limit.push_back(end);
    h.bucket.push_back(count);
  }
  *out = std::move(h);
  return true;
}

}  // namespace ember::summary
