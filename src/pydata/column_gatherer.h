// The columns of a batch of Python samples (internal to Stoker's Python-dataset engine).
//
// batch_structure.flatten (python/stoker/batch_structure.py) describes sample 0 as a tree of
// tuples: ("L", k, dtype, shape) tensor leaf k; ("A", k, dtype str, shape) NumPy leaf k;
// ("O", k, type) object leaf k; ("M", type, keys, children) mapping; ("N", type, children)
// namedtuple; ("T", children) tuple; ("S", type, children) list or other sequence.
// gather_columns checks that every sample has that structure, with leaves of sample 0's exact
// types (and NumPy leaves of its dtypes), and returns the leaves as columns: array leaf k of every
// sample in array column k, object leaf k in object column k. Shapes are left to the stacking
// that follows, which raises exactly as torch's default_collate would. The tree is compiled once a
// batch, so a sample costs type checks and list appends (~30 ns for a (tensor, int) sample).
//
// REQUIRES: the GIL. Errors: PythonError with the Python error set (a malformed structure is a
// TypeError; an exception from a sample's __getitem__/keys() propagates).
#pragma once

#include <Python.h>

#include "pydata/py_ref.h"

namespace stoker::python {

// (array columns, object columns) as a tuple of two lists of lists, or None when a sample
// differs from sample 0. `array_types`, `object_types`: tuples of the leaves' types;
// `np_dtypes[k]`: the dtype NumPy leaf k must have (None for tensors).
PyRef gather_columns(PyObject* structure, PyObject* samples, PyObject* array_types,
                     PyObject* object_types, PyObject* np_dtypes);

}  // namespace stoker::python
