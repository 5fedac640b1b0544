// The columns of a batch of Python samples (the Python-dataset wing's API, for Stoker's own
// bindings).
//
// The batch tree, defined here once (its tags are exported as _native.pydata.TREE_TAGS, which
// python/stoker/pydata/batch_structure.py builds and reads trees with): batch_structure.flatten
// describes a batch, or sample 0 of one, as a tree of tuples, each led by its tag:
//   (kTensorLeaf, k, torch dtype, shape)          tensor leaf k (array leaf k of the batch)
//   (kNdarrayLeaf, k, NumPy dtype str, shape)     NumPy array leaf k (array leaf k)
//   (kObjectLeaf, k, type)                        object leaf k: anything else (str, int, ...)
//   (kMapping, type, keys, children)              a Mapping: its keys in order, a child for each
//   (kNamedTuple, type, children)                 a namedtuple
//   (kTuple, children)                            a plain tuple
//   (kSequence, type, children)                   a list (or subclass)
// Array and object leaves are numbered apart, in the order a depth-first walk meets them.
//
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

#include <utility>

#include "stoker/pydata/py_ref.h"

namespace stoker::python {

// The tags of the batch tree (see above); one character each.
namespace tree_tag {
inline constexpr char kTensorLeaf = 'L';
inline constexpr char kNdarrayLeaf = 'A';
inline constexpr char kObjectLeaf = 'O';
inline constexpr char kMapping = 'M';
inline constexpr char kNamedTuple = 'N';
inline constexpr char kTuple = 'T';
inline constexpr char kSequence = 'S';
// (name, tag) of each, as _native.pydata.TREE_TAGS maps them.
inline constexpr std::pair<const char*, char> kAll[] = {
    {"tensor", kTensorLeaf},   {"ndarray", kNdarrayLeaf}, {"object", kObjectLeaf},
    {"mapping", kMapping},     {"namedtuple", kNamedTuple}, {"tuple", kTuple},
    {"sequence", kSequence}};
}  // namespace tree_tag

// (array columns, object columns) as a tuple of two lists of lists, or None when a sample
// differs from sample 0. `array_types`, `object_types`: tuples of the leaves' types;
// `np_dtypes[k]`: the dtype NumPy leaf k must have (None for tensors).
PyRef gather_columns(PyObject* structure, PyObject* samples, PyObject* array_types,
                     PyObject* object_types, PyObject* np_dtypes);

}  // namespace stoker::python
