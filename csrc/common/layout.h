// layout.h: the builder of amp_inspect._C.layout() (module.cpp), the tables a binary was compiled with as Python
// objects, written once for every op's part of it. Python's limited API only.
//
// Every function returns a new reference, or null with a Python error set, and takes over the references it is
// handed, null ones included, also when it fails: so a table is written as one nested expression, and a failed
// allocation anywhere releases everything made so far and yields null at the top.
#pragma once

#include <Python.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "common/op.h"

namespace amp_inspect::layout {

inline PyObject* text(const char* s) { return PyUnicode_FromString(s); }
inline PyObject* integer(long v) { return PyLong_FromLong(v); }
inline PyObject* bits(unsigned long long v) { return PyLong_FromUnsignedLongLong(v); }  // a bit pattern, unsigned
inline PyObject* real(double v) { return PyFloat_FromDouble(v); }

// A tuple of `items`.
inline PyObject* tuple_of(std::initializer_list<PyObject*> items) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  Py_ssize_t i = 0;
  for (PyObject* item : items) {
    if (tuple == nullptr || item == nullptr) {
      Py_XDECREF(item);
      continue;
    }
    PyTuple_SetItem(tuple, i++, item);  // steals
  }
  if (tuple != nullptr && i != static_cast<Py_ssize_t>(items.size())) {
    Py_DECREF(tuple);  // slots left empty are released like full ones
    return nullptr;
  }
  return tuple;
}

// A tuple of `n` rows, row(i) each.
template <class Row>
PyObject* tuple_of_rows(int64_t n, Row&& row) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (tuple == nullptr) return nullptr;
  for (int64_t i = 0; i < n; ++i) {
    PyObject* item = row(i);
    if (item == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SetItem(tuple, static_cast<Py_ssize_t>(i), item);  // steals
  }
  return tuple;
}

// A tuple of the `n` strings of a table of names.
inline PyObject* names(const char* const* table, int64_t n) {
  return tuple_of_rows(n, [table](int64_t i) { return text(table[i]); });
}

// A dict of `items`, in their order (Python keeps it).
inline PyObject* dict_of(std::initializer_list<std::pair<const char*, PyObject*>> items) {
  bool complete = true;
  for (const auto& item : items) complete = complete && item.second != nullptr;
  PyObject* dict = complete ? PyDict_New() : nullptr;
  for (const auto& [key, value] : items) {
    if (dict != nullptr && PyDict_SetItemString(dict, key, value) != 0) {
      Py_DECREF(dict);
      dict = nullptr;
    }
    Py_XDECREF(value);  // the dict holds its own reference
  }
  return dict;
}

// An output's dtype as Python's statistics schema names it.
inline const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Long:
      return "int64";
    case ScalarType::Float:
      return "float32";
    case ScalarType::Double:
      return "float64";
    default:
      return "?";
  }
}

// The outputs of a tallying op (common/op.h's kTallyOutputs): ((name, dtype), ...), in the op's order.
inline PyObject* tally_outputs() {
  return tuple_of_rows(kNumTallyOutputs, [](int64_t k) {
    return tuple_of({text(kTallyOutputs[k].name), text(dtype_name(kTallyOutputs[k].dtype))});
  });
}

}  // namespace amp_inspect::layout
