// Maps Stoker's C++ exceptions to Python exceptions, keeping their type and, for a failed sample,
// its index, path and cause (as __cause__).
#include "stoker/errors.h"

#include <nanobind/stl/string.h>

#include "bindings.h"

namespace stoker::python {
namespace {

nb::object error_class(const char* name) {
  return nb::module_::import_("stoker.errors").attr(name);
}

// A Python exception instance for `error`, or an empty object for types not Stoker's.
nb::object to_python(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const SampleError& e) {
    nb::object exc = error_class("SampleError")(e.what(), e.index(), e.path());
    nb::object cause = to_python(e.cause());
    if (!cause.is_valid()) {
      cause = nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s",
                                              SampleError::message_of(e.cause()).c_str()));
    }
    PyException_SetCause(exc.ptr(), cause.release().ptr());
    return exc;
  } catch (const DecodeError& e) {
    return error_class("DecodeError")(e.what());
  } catch (const BudgetExceeded& e) {
    return error_class("MemoryBudgetError")(e.what());
  } catch (const TemplateError& e) {
    return error_class("TemplateError")(e.what());
  } catch (const InvalidArgument& e) {
    return nb::steal(PyObject_CallFunction(PyExc_ValueError, "s", e.what()));
  } catch (const IoError& e) {
    return nb::steal(PyObject_CallFunction(PyExc_OSError, "s", e.what()));
  } catch (const Error& e) {
    return nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s", e.what()));
  } catch (...) {
    return {};
  }
}

}  // namespace

void register_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    nb::object exc = to_python(p);
    if (!exc.is_valid()) std::rethrow_exception(p);  // nanobind's default translation
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  });
}

}  // namespace stoker::python
