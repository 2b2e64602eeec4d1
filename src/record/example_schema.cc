// SchemaInferrer: what features a sample of tf.Examples holds, of which kind
// and how many values per row (so a caller can tell scalars, fixed-size and
// variable-size lists apart).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ember/example.h"
#include "record/example_parse.h"

namespace ember::example {

Status SchemaInferrer::Add(std::string_view serialized) {
  const size_t row = rows_;
  // This row's entries; a key given twice keeps its last value.
  std::vector<std::pair<std::string_view, std::string_view>> entries;
  bool ok = parse::ForEachFeature(serialized, [&](std::string_view key, std::string_view value) {
    entries.emplace_back(key, value);
  });
  if (!ok) return Status::Corruption("Example at row " + std::to_string(row) + ": malformed protobuf");
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  struct Seen {
    std::string_view name;
    int kind;
    int64_t length;
  };
  std::vector<Seen> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i + 1 < entries.size() && entries[i + 1].first == entries[i].first) continue;  // not the last
    const auto& [key, value] = entries[i];
    parse::Resolved r;
    if (!parse::Resolve(value, &r)) {
      return Status::Corruption("Example at row " + std::to_string(row) + ", feature '" + std::string(key) +
                                "': malformed Feature");
    }
    int64_t length = 0;
    if (r.kind != 0) {
      bool good = parse::ForEachList(value, r, [&](std::string_view list) {
        int64_t n = parse::CountValues(list, r.kind);
        if (n < 0) return false;
        length += n;
        return true;
      });
      if (!good) {
        return Status::Corruption("Example at row " + std::to_string(row) + ", feature '" + std::string(key) +
                                  "': malformed list");
      }
    }
    seen.push_back({key, r.kind, length});
  }
  // Check kinds before changing anything, so a failed row leaves no trace.
  for (const Seen& s : seen) {
    auto it = std::lower_bound(features_.begin(), features_.end(), s.name,
                               [](const InferredFeature& f, std::string_view n) { return f.name < n; });
    if (it == features_.end() || it->name != s.name || s.kind == 0) continue;
    size_t idx = static_cast<size_t>(it - features_.begin());
    if (kind_known_[idx] && static_cast<int>(it->kind) != s.kind) {
      return Status::InvalidArgument("Example at row " + std::to_string(row) + ", feature '" +
                                     std::string(s.name) + "': holds a " +
                                     std::string(KindName(static_cast<FeatureKind>(s.kind))) +
                                     " list, earlier rows a " + std::string(KindName(it->kind)) + " list");
    }
  }
  for (const Seen& s : seen) {
    auto it = std::lower_bound(features_.begin(), features_.end(), s.name,
                               [](const InferredFeature& f, std::string_view n) { return f.name < n; });
    size_t idx = static_cast<size_t>(it - features_.begin());
    if (it == features_.end() || it->name != s.name) {
      InferredFeature f;
      f.name = std::string(s.name);
      f.min_length = f.max_length = s.length;
      features_.insert(it, std::move(f));
      kind_known_.insert(kind_known_.begin() + static_cast<std::ptrdiff_t>(idx), 0);
    } else {
      it->min_length = std::min(it->min_length, s.length);
      it->max_length = std::max(it->max_length, s.length);
    }
    InferredFeature& f = features_[idx];
    ++f.present_rows;
    if (s.kind != 0 && !kind_known_[idx]) {
      f.kind = static_cast<FeatureKind>(s.kind);
      kind_known_[idx] = 1;
    }
  }
  ++rows_;
  return Status::OK();
}

std::vector<InferredFeature> SchemaInferrer::Finish() const { return features_; }

}  // namespace ember::example
