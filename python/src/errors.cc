#include "python/src/errors.h"

#include <nanobind/nanobind.h>

#include <exception>
#include <new>
#include <string>

namespace nb = nanobind;

namespace ckpt::python {
namespace {

// Sets the Python error to ckpt.errors.BY_CODE[code](message) (ckpt.Internal when unknown).
void RaiseStatus(int code, const std::string& message) {
  try {
    nb::module_ errors = nb::module_::import_("ckpt.errors");
    nb::dict by_code = nb::borrow<nb::dict>(errors.attr("BY_CODE"));
    nb::object cls = by_code.contains(nb::int_(code)) ? nb::object(by_code[nb::int_(code)])
                                                      : nb::object(errors.attr("Internal"));
    PyErr_SetObject(cls.ptr(), nb::str(message.data(), message.size()).ptr());
  } catch (nb::python_error& e) {
    e.restore();  // ckpt.errors itself failed to import: report that instead
  }
}

void Translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const StatusError& e) {
    RaiseStatus(static_cast<int>(e.status.code()), std::string(e.status.message()));
  } catch (const nb::python_error&) {
    throw;  // a Python exception raised inside a callback: nanobind restores it
  } catch (const nb::builtin_exception&) {
    throw;  // nanobind's own (argument conversion, next overload)
  } catch (const std::bad_alloc&) {
    RaiseStatus(static_cast<int>(absl::StatusCode::kResourceExhausted),
                "out of memory in the ckpt extension");
  } catch (const std::exception& e) {
    RaiseStatus(static_cast<int>(absl::StatusCode::kInternal),
                std::string("ckpt extension: ") + e.what());
  }
}

}  // namespace

void RegisterErrorTranslator() { nb::register_exception_translator(&Translate); }

}  // namespace ckpt::python
