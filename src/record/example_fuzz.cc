// libFuzzer target for the tf.Example decoder and schema inference
// (ember/example.h): records come from files anyone may write.  A row the
// decoder accepts must encode and decode again to the same columns.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ember/example.h"

using namespace ember::example;

namespace {

bool SameColumns(const std::vector<FeatureColumn>& a, const std::vector<FeatureColumn>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].floats.size() != b[i].floats.size() || a[i].ints != b[i].ints || a[i].bytes_data != b[i].bytes_data ||
        a[i].bytes_offsets != b[i].bytes_offsets || a[i].row_splits != b[i].row_splits ||
        a[i].present != b[i].present) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  SchemaInferrer inferrer;
  (void)inferrer.Add(bytes);
  (void)inferrer.Finish();

  auto decoder = ExampleDecoder::Make({{"a", FeatureKind::kBytes, -1}, {"b", FeatureKind::kFloat, -1},
                                       {"c", FeatureKind::kInt64, -1}, {"d", FeatureKind::kInt64, 1}});
  if (!decoder.ok()) std::abort();
  if (!decoder->Add(bytes).ok()) return 0;
  std::vector<FeatureColumn> cols = decoder->Finish();
  std::vector<ColumnView> views;
  for (const FeatureColumn& c : cols) views.push_back(View(c));
  std::string encoded;
  std::vector<int64_t> offsets;
  if (!EncodeExamples(views, &encoded, &offsets).ok()) std::abort();
  auto again = ExampleDecoder::Make({{"a", FeatureKind::kBytes, -1}, {"b", FeatureKind::kFloat, -1},
                                     {"c", FeatureKind::kInt64, -1}, {"d", FeatureKind::kInt64, 1}});
  if (!again.ok() || !again->Add(encoded).ok()) std::abort();
  if (!SameColumns(cols, again->Finish())) std::abort();
  return 0;
}
