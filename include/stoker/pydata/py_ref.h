// An owned reference to a Python object (the Python-dataset wing's API, for Stoker's own bindings).
//
// The engine code in src/pydata/ is written against the CPython C API, not nanobind, so that
// its tests can embed the interpreter in a plain gtest binary. Ownership: a PyRef owns one
// reference and drops it when destroyed. REQUIRES: the GIL for everything except moving a PyRef.
#pragma once

#include <Python.h>

#include <utility>

namespace stoker::python {

class PyRef {
 public:
  PyRef() = default;
  // Takes ownership of a new reference (which may be null: a call that failed).
  static PyRef steal(PyObject* p) { return PyRef(p); }
  // Adds a reference to a borrowed one.
  static PyRef borrow(PyObject* p) {
    Py_XINCREF(p);
    return PyRef(p);
  }
  PyRef(PyRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PyRef& operator=(PyRef&& o) noexcept {
    if (this != &o) {
      Py_XDECREF(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef& o) : p_(o.p_) { Py_XINCREF(p_); }
  PyRef& operator=(const PyRef& o) { return *this = PyRef(o); }
  ~PyRef() { Py_XDECREF(p_); }

  PyObject* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  // Gives the reference away (the caller owns it).
  PyObject* release() { return std::exchange(p_, nullptr); }

 private:
  explicit PyRef(PyObject* p) : p_(p) {}
  PyObject* p_ = nullptr;
};

// Thrown where a CPython call failed: the Python error is set (the binding layer re-raises it).
struct PythonError {};

// Throws PythonError when `p` is null (a failed call), else returns it.
inline PyRef check(PyRef p) {
  if (!p) throw PythonError{};
  return p;
}

// The pending exception (normalized, its traceback attached), which it clears; empty if none.
// Written once for both APIs: PyErr_Fetch is deprecated from 3.12, whose replacement
// PyErr_GetRaisedException the limited API of the cp312-abi3 wheel has.
inline PyRef fetch_error() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyRef::steal(PyErr_GetRaisedException());
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return PyRef::steal(value);
#endif
}

// Raises `error` (from fetch_error) again, as it was.
inline void restore_error(PyRef error) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(error.release());
#else
  PyObject* value = error.release();
  if (value == nullptr) return;
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(value))), value,
                PyException_GetTraceback(value));
#endif
}

}  // namespace stoker::python
