#include "stoker/pydata/column_gatherer.h"

#include <cstddef>
#include <vector>

namespace stoker::python {
namespace {

using namespace tree_tag;

struct Node {
  char tag = 0;                 // a tree_tag (column_gatherer.h)
  PyObject* type = nullptr;     // the exact type (L, A, O: the leaf's; M, N, S: the node's)
  PyObject* column = nullptr;   // L, A, O: the list the leaf goes to
  PyObject* dtype = nullptr;    // A: the NumPy dtype it must have
  std::vector<PyObject*> keys;  // M: the keys, in order
  std::vector<Node> children;
};

[[noreturn]] void malformed(const char* what) {
  PyErr_Format(PyExc_TypeError, "gather_columns: malformed structure (%s)", what);
  throw PythonError{};
}

PyObject* item(PyObject* tuple, Py_ssize_t i) {
  if (!PyTuple_Check(tuple) || i >= PyTuple_Size(tuple)) malformed("a node is too short");
  return PyTuple_GetItem(tuple, i);
}

// Every object a Node points to is borrowed from the structure, the type tuples or the column
// lists, all alive for the call.
class Gatherer {
 public:
  Gatherer(PyObject* array_types, PyObject* object_types, PyObject* np_dtypes)
      : array_types_(array_types), object_types_(object_types), np_dtypes_(np_dtypes) {
    if (!PyTuple_Check(array_types) || !PyTuple_Check(object_types) || !PyTuple_Check(np_dtypes) ||
        PyTuple_Size(np_dtypes) != PyTuple_Size(array_types))
      malformed("the type tuples");
    array_cols_ = new_columns(PyTuple_Size(array_types));
    object_cols_ = new_columns(PyTuple_Size(object_types));
  }

  Node compile(PyObject* node) {
    Node out;
    PyObject* tag = item(node, 0);
    if (!PyUnicode_Check(tag) || PyUnicode_GetLength(tag) != 1) malformed("a tag");
    out.tag = static_cast<char>(PyUnicode_ReadChar(tag, 0));
    switch (out.tag) {
      case kTensorLeaf:
      case kNdarrayLeaf:
      case kObjectLeaf: {
        const Py_ssize_t k = PyLong_AsSsize_t(item(node, 1));
        const bool array = out.tag != kObjectLeaf;
        PyObject* types = array ? array_types_ : object_types_;
        if (k < 0 || k >= PyTuple_Size(types)) {
          PyErr_Clear();
          malformed("a leaf number");
        }
        out.type = PyTuple_GetItem(types, k);
        out.column = PyList_GetItem((array ? array_cols_ : object_cols_).get(), k);
        if (out.tag == kNdarrayLeaf) out.dtype = PyTuple_GetItem(np_dtypes_, k);
        return out;
      }
      case kMapping: {  // (tag, type, keys, children)
        PyObject* keys = item(node, 2);
        if (!PyTuple_Check(keys)) malformed("mapping keys");
        for (Py_ssize_t i = 0; i < PyTuple_Size(keys); ++i)
          out.keys.push_back(PyTuple_GetItem(keys, i));
        [[fallthrough]];
      }
      case kNamedTuple:  // (tag, type, children)
      case kSequence:    // (tag, type, children)
      case kTuple: {     // (tag, children)
        out.type = out.tag == kTuple ? reinterpret_cast<PyObject*>(&PyTuple_Type) : item(node, 1);
        PyObject* children = item(node, out.tag == kMapping ? 3 : out.tag == kTuple ? 1 : 2);
        if (!PyTuple_Check(children)) malformed("children");
        if (out.tag == kMapping &&
            PyTuple_Size(children) != static_cast<Py_ssize_t>(out.keys.size()))
          malformed("keys and children differ in number");
        for (Py_ssize_t i = 0; i < PyTuple_Size(children); ++i)
          out.children.push_back(compile(PyTuple_GetItem(children, i)));
        return out;
      }
      default:
        malformed("an unknown tag");
    }
  }

  // Appends the sample's leaves to the columns; false at the first difference.
  bool gather(const Node& node, PyObject* obj) const {
    if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != node.type) return false;
    switch (node.tag) {
      case kNdarrayLeaf: {
        const PyRef dtype = check(PyRef::steal(PyObject_GetAttrString(obj, "dtype")));
        const int same = PyObject_RichCompareBool(dtype.get(), node.dtype, Py_EQ);
        if (same < 0) throw PythonError{};
        if (!same) return false;
        [[fallthrough]];
      }
      case kTensorLeaf:
      case kObjectLeaf:
        if (PyList_Append(node.column, obj) != 0) throw PythonError{};
        return true;
      case kTuple: {
        if (PyTuple_Size(obj) != static_cast<Py_ssize_t>(node.children.size())) return false;
        for (size_t i = 0; i < node.children.size(); ++i)
          if (!gather(node.children[i], PyTuple_GetItem(obj, static_cast<Py_ssize_t>(i))))
            return false;
        return true;
      }
      case kMapping: {
        const Py_ssize_t n = PyObject_Length(obj);
        if (n < 0) throw PythonError{};
        if (n != static_cast<Py_ssize_t>(node.keys.size())) return false;
        const PyRef keys = check(PyRef::steal(PyObject_CallMethod(obj, "keys", nullptr)));
        const PyRef it = check(PyRef::steal(PyObject_GetIter(keys.get())));
        size_t i = 0;
        while (PyRef key = PyRef::steal(PyIter_Next(it.get()))) {
          if (i >= node.keys.size()) return false;
          const int same = PyObject_RichCompareBool(key.get(), node.keys[i++], Py_EQ);
          if (same < 0) throw PythonError{};
          if (!same) return false;
        }
        if (PyErr_Occurred()) throw PythonError{};
        for (i = 0; i < node.keys.size(); ++i) {
          const PyRef child = check(PyRef::steal(PyObject_GetItem(obj, node.keys[i])));
          if (!gather(node.children[i], child.get())) return false;
        }
        return true;
      }
      default: {  // kNamedTuple, kSequence
        const Py_ssize_t n = PyObject_Length(obj);
        if (n < 0) throw PythonError{};
        if (n != static_cast<Py_ssize_t>(node.children.size())) return false;
        for (size_t i = 0; i < node.children.size(); ++i) {
          const PyRef child =
              check(PyRef::steal(PySequence_GetItem(obj, static_cast<Py_ssize_t>(i))));
          if (!gather(node.children[i], child.get())) return false;
        }
        return true;
      }
    }
  }

  PyRef columns() const {
    return check(PyRef::steal(PyTuple_Pack(2, array_cols_.get(), object_cols_.get())));
  }

 private:
  static PyRef new_columns(Py_ssize_t n) {
    PyRef cols = check(PyRef::steal(PyList_New(n)));
    for (Py_ssize_t k = 0; k < n; ++k)
      if (PyList_SetItem(cols.get(), k, check(PyRef::steal(PyList_New(0))).release()) != 0)
        throw PythonError{};
    return cols;
  }

  PyObject* array_types_;
  PyObject* object_types_;
  PyObject* np_dtypes_;
  PyRef array_cols_, object_cols_;
};

}  // namespace

PyRef gather_columns(PyObject* structure, PyObject* samples, PyObject* array_types,
                     PyObject* object_types, PyObject* np_dtypes) {
  Gatherer gatherer(array_types, object_types, np_dtypes);
  const Node root = gatherer.compile(structure);
  const PyRef seq = check(PyRef::steal(PySequence_List(samples)));
  const Py_ssize_t n = PyList_Size(seq.get());
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!gatherer.gather(root, PyList_GetItem(seq.get(), i))) return PyRef::borrow(Py_None);
  return gatherer.columns();
}

}  // namespace stoker::python
