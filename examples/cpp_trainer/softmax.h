// Softmax regression (multinomial logistic regression) on 28x28 images:
// logits = W x + b, x = pixels / 255.  Plain mini-batch SGD on the mean
// cross-entropy.  No framework; a few hundred lines of arithmetic.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cpp_trainer {

inline constexpr int kPixels = 784;
inline constexpr int kClasses = 10;

class SoftmaxModel {
 public:
  SoftmaxModel();  // zero weights: every node starts from the same model

  // One SGD step on `rows` images (`pixels`: rows x kPixels bytes, row-major)
  // with `labels` (0..9).  Returns the batch's mean loss before the step.
  double TrainStep(std::span<const uint8_t> pixels, std::span<const int64_t> labels, double lr);

  // The most likely class of each of the `pixels.size() / kPixels` images.
  std::vector<int64_t> Predict(std::span<const uint8_t> pixels) const;

  // The parameters, W (kClasses x kPixels) then b (kClasses), in place: what
  // the nodes average with an allreduce.
  std::span<float> parameters() { return params_; }

 private:
  void Logits(const uint8_t* image, float* out) const;
  std::vector<float> params_;  // W (kClasses x kPixels), then b (kClasses)
};

}  // namespace cpp_trainer
