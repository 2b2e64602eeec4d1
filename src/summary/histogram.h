// Histograms as TF1's summary.histogram made them (tensorflow/core/lib/
// histogram/histogram.cc), so TensorBoard draws Ember's the way it drew
// TF's.  Internal to src/summary.
#pragma once

#include <span>
#include <vector>

#include "summary/event_encode.h"

namespace ember::summary {

// TF1's default bucket limits: 0, ±1e-12 growing by 10% up to ±1e20, and
// ±DBL_MAX at the ends; ascending.
const std::vector<double>& DefaultBucketLimits();

// Fills `out` with the histogram of `values` over DefaultBucketLimits(),
// each run of empty buckets collapsed into one (TF's EncodeToProto); an
// empty histogram has min DBL_MAX, max -DBL_MAX and one empty bucket, as
// TF's.  False, leaving `out` unspecified, if a value is NaN or infinite.
bool BuildHistogram(std::span<const double> values, Histogram* out);

}  // namespace ember::summary
