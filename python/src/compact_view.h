// The coordinator's expansion of compact rank descriptions (proto/compact_convert.h, issue 16)
// for Python: the oracle test compares it with PyTorch's own DTensor sharding, and trainers can
// see how large the description their worker sends is, compact and listed.
#ifndef CKPT_PYTHON_SRC_COMPACT_VIEW_H_
#define CKPT_PYTHON_SRC_COMPACT_VIEW_H_

#include <nanobind/nanobind.h>

#include "client/state_dict.h"

namespace ckpt::python {

// Adds expand_compact_dtensor and expand_compact_flat to `m`.
void RegisterCompactView(nanobind::module_& m);

// {"compact_bytes", "full_bytes", "compact_tensors", "pieces"}: the serialized RankState the
// worker sends for `state` (DTensors compact where exact) and the one listing every piece.
nanobind::dict DescriptionBytes(const client::StateDict& state);

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_SRC_COMPACT_VIEW_H_
