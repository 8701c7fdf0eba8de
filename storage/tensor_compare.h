// Comparing two checkpoints tensor by tensor (ckptctl diff): which keys each side lacks,
// which tensors differ in dtype or shape, and, piece by piece of a tensor's row-major
// elements, which elements differ. Pure: no I/O; the caller reads both sides in bounded chunks
// (ElementChunks) and feeds them to a TensorComparison.
//
// Elements are compared bit for bit (the question is whether a resume restored exactly what was
// saved): +0.0 and -0.0 differ, and a NaN equals only a NaN with the same bits.
#ifndef CKPT_STORAGE_TENSOR_COMPARE_H_
#define CKPT_STORAGE_TENSOR_COMPARE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "sharding/dtype.h"

namespace ckpt {

// One tensor as a checkpoint lists it.
struct TensorDescription {
  std::string key;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// How two tensor lists relate, every list sorted by key.
struct TensorListDiff {
  std::vector<std::string> only_in_a;
  std::vector<std::string> only_in_b;
  // Same key, different dtype or shape: (a's, b's).
  std::vector<std::pair<TensorDescription, TensorDescription>> mismatched;
  // Same key, dtype and shape: contents to compare.
  std::vector<TensorDescription> comparable;
};

// Matches the lists by key (each list's keys must be distinct; a repeated key counts once,
// its first description).
TensorListDiff DiffTensorLists(std::vector<TensorDescription> a, std::vector<TensorDescription> b);

// "[start, stop)" ranges of a tensor's row-major element indices, in order, each of at most
// `max_elements` (>= 1) elements, covering [0, num_elements). None for an empty tensor.
std::vector<std::pair<int64_t, int64_t>> ElementChunks(int64_t num_elements, int64_t max_elements);

// The row-major coordinates of element `index` of a tensor of `shape` ([] for a 0-d tensor).
std::vector<int64_t> UnravelIndex(absl::Span<const int64_t> shape, int64_t index);

// One element's value as text: integers and bools exactly, floats (F8 to F64, C64 as a pair)
// with enough digits to tell neighbours apart plus the raw bits, e.g. "1.5 (0x3fc00000)".
std::string FormatElement(DType dtype, const char* bytes);

// The result of comparing one tensor's contents.
struct ElementDifference {
  int64_t differing = 0;         // elements whose bits differ
  int64_t first_index = -1;      // row-major index of the first, or -1
  std::string first_a, first_b;  // its two values (FormatElement)
  // Floating dtypes: the largest |a - b| over differing elements where both are finite,
  // and whether some differing element has a NaN or infinity on a side.
  std::optional<double> max_abs_difference;
  bool non_finite_difference = false;
};

// Accumulates the comparison of one tensor fed chunk by chunk in order.
class TensorComparison {
 public:
  explicit TensorComparison(DType dtype) : dtype_(dtype) {}

  // Compares elements [start, start + n) given as the two sides' bytes (n * element size
  // each). Chunks must come in increasing order for first_index to be the first.
  void AddChunk(int64_t start, absl::Span<const char> a, absl::Span<const char> b);

  const ElementDifference& result() const { return result_; }

 private:
  DType dtype_;
  ElementDifference result_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_TENSOR_COMPARE_H_
