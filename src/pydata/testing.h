// Helpers for the tests of src/pydata/ (an embedded interpreter; see test_main.cc).
#pragma once

#include <Python.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "stoker/pydata/global_seeder.h"
#include "stoker/pydata/py_ref.h"

namespace stoker::python::testing {

// Runs `code` in a fresh module namespace and returns that namespace (a dict).
inline PyRef run(const std::string& code) {
  PyRef globals = check(PyRef::steal(PyDict_New()));
  PyDict_SetItemString(globals.get(), "__builtins__", PyEval_GetBuiltins());
  PyRef result =
      PyRef::steal(PyRun_String(code.c_str(), Py_file_input, globals.get(), globals.get()));
  if (!result) {
    PyErr_Print();
    ADD_FAILURE() << "Python code failed:\n" << code;
  }
  return globals;
}

// The value of `name` in namespace `ns` (borrowed as a new reference).
inline PyRef get(const PyRef& ns, const char* name) {
  return PyRef::borrow(PyDict_GetItemString(ns.get(), name));
}

// Evaluates `expr` in namespace `ns`.
inline PyRef eval(const PyRef& ns, const std::string& expr) {
  PyRef r = PyRef::steal(PyRun_String(expr.c_str(), Py_eval_input, ns.get(), ns.get()));
  if (!r) {
    PyErr_Print();
    ADD_FAILURE() << "Python expression failed: " << expr;
  }
  return r;
}

// repr(obj) as a string.
inline std::string repr(PyObject* obj) {
  PyRef r = PyRef::steal(PyObject_Repr(obj));
  if (!r) {
    PyErr_Clear();
    return "<repr failed>";
  }
  return PyUnicode_AsUTF8(r.get());
}

// The pending Python exception's type name and message, cleared ("" when none is pending).
inline std::string take_error() {
  if (!PyErr_Occurred()) return "";
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyRef t = PyRef::steal(type), v = PyRef::steal(value), b = PyRef::steal(tb);
  PyRef s = PyRef::steal(PyObject_Str(v.get()));
  return std::string(reinterpret_cast<PyTypeObject*>(t.get())->tp_name) + ": " +
         (s ? PyUnicode_AsUTF8(s.get()) : "?");
}

// Memory laid out as the three generators keep their states (see global_seeder.h).
struct FakeGenerators {
  struct {
    int index = 17;
    uint32_t state[624] = {};
  } py;
  struct {
    uint32_t key[624] = {};
    int pos = 5;
  } np;
  int np_has_gauss = 1;
  double np_gauss = 0.25;
  struct {
    TorchMt mt{};
    std::optional<float> f = 1.5f;
    std::optional<double> d = -2.5;
  } torch;
  PyRef dict = check(PyRef::steal(PyDict_New()));

  FakeGenerators() {
    PyRef cached = check(PyRef::steal(PyFloat_FromDouble(0.5)));
    PyDict_SetItemString(dict.get(), "gauss_next", cached.get());
    torch.mt.left = 9;
    torch.mt.next = 3;
  }

  GeneratorFields fields() {
    GeneratorFields f;
    f.py_index = &py.index;
    f.py_state = py.state;
    f.py_dict = dict.get();
    f.np_key = np.key;
    f.np_pos = &np.pos;
    f.np_has_gauss = &np_has_gauss;
    f.np_gauss = &np_gauss;
    f.torch_mt = &torch.mt;
    // optional<T>: the value, then the engaged flag (the layout rng_fields.py verifies)
    f.torch_float_engaged = reinterpret_cast<bool*>(&torch.f) + sizeof(float);
    f.torch_double_engaged = reinterpret_cast<bool*>(&torch.d) + sizeof(double);
    return f;
  }
};

}  // namespace stoker::python::testing
