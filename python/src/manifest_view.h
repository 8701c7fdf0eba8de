// A committed checkpoint's manifest as a Python dict, for the Python package's checks before
// a load (missing or extra keys, shape and dtype mismatches, named) and for its non-tensor
// values, whose stored sizes it gives.
#ifndef CKPT_PYTHON_SRC_MANIFEST_VIEW_H_
#define CKPT_PYTHON_SRC_MANIFEST_VIEW_H_

#include <nanobind/nanobind.h>

#include <string>

namespace ckpt::python {

// {"tensors": {key: (dtype name, [global shape])}, "metadata": {str: str}, "step": int}.
// NotFound when `path` holds no committed checkpoint (no manifest.pb); DataLoss when it does
// not parse. A directory's manifest.pb is only parsed: the coordinator validates the whole
// manifest again before any load touches memory. An object-store URL (s3://...) is opened
// through the store registry (storage/checkpoint_store.h), which validates its manifest.
nanobind::dict ReadManifestDict(const std::string& path);

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_SRC_MANIFEST_VIEW_H_
