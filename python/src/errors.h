// The one place the Python extension turns absl::Status into Python exceptions: the classes of
// ckpt.errors (ckpt.Error and one subclass per status code), keeping the message. Any other C++
// exception that reaches Python becomes ckpt.Internal (std::bad_alloc: ckpt.ResourceExhausted),
// so nothing but ckpt.Error crosses from C++ (besides nanobind's own argument TypeErrors).
#ifndef CKPT_PYTHON_SRC_ERRORS_H_
#define CKPT_PYTHON_SRC_ERRORS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::python {

// Thrown by ThrowIfError; translated into the ckpt.errors class of its code.
struct StatusError {
  absl::Status status;
};

// Throws StatusError for a non-OK status.
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

// The value, or throws StatusError.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return *std::move(value);
}

// Registers the translator (call once from the module's init; imports ckpt.errors lazily at
// the first error, so the extension imports before the package finished importing).
void RegisterErrorTranslator();

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_SRC_ERRORS_H_
