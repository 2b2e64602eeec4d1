#include "softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cpp_trainer {
namespace {
constexpr size_t kParams = kClasses * kPixels + kClasses;
constexpr float kScale = 1.0f / 255.0f;
}  // namespace

SoftmaxModel::SoftmaxModel() : params_(kParams, 0.0f) {}

void SoftmaxModel::Logits(const uint8_t* image, float* out) const {
  const float* bias = params_.data() + kClasses * kPixels;
  for (int c = 0; c < kClasses; ++c) {
    const float* w = params_.data() + c * kPixels;
    float z = 0;
    for (int p = 0; p < kPixels; ++p) z += w[p] * static_cast<float>(image[p]);
    out[c] = z * kScale + bias[c];
  }
}

double SoftmaxModel::TrainStep(std::span<const uint8_t> pixels, std::span<const int64_t> labels,
                               double lr) {
  const size_t rows = labels.size();
  if (rows == 0) return 0;
  std::vector<float> grad(kParams, 0.0f);
  double loss = 0;
  float z[kClasses];
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* image = pixels.data() + i * kPixels;
    Logits(image, z);
    const float top = *std::max_element(z, z + kClasses);
    float sum = 0;
    for (float& v : z) sum += (v = std::exp(v - top));
    const int64_t label = labels[i];
    loss -= std::log(std::max(z[label] / sum, 1e-30f));
    for (int c = 0; c < kClasses; ++c) {
      // d(loss)/d(logit c) = p_c - [c == label]
      const float d = z[c] / sum - (c == label ? 1.0f : 0.0f);
      float* g = grad.data() + c * kPixels;
      const float ds = d * kScale;
      for (int p = 0; p < kPixels; ++p) g[p] += ds * static_cast<float>(image[p]);
      grad[kClasses * kPixels + c] += d;
    }
  }
  const float step = static_cast<float>(lr / static_cast<double>(rows));
  for (size_t k = 0; k < kParams; ++k) params_[k] -= step * grad[k];
  return loss / static_cast<double>(rows);
}

std::vector<int64_t> SoftmaxModel::Predict(std::span<const uint8_t> pixels) const {
  std::vector<int64_t> out(pixels.size() / kPixels);
  float z[kClasses];
  for (size_t i = 0; i < out.size(); ++i) {
    Logits(pixels.data() + i * kPixels, z);
    out[i] = std::max_element(z, z + kClasses) - z;
  }
  return out;
}

}  // namespace cpp_trainer
