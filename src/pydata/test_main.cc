// gtest main for the Python-dataset engine's tests: embeds the interpreter (isolated: no site,
// no environment; the raw malloc allocator, so that ASan sees every Python allocation).
#include <Python.h>
#include <gtest/gtest.h>

// ASan builds: what the interpreter keeps until exit (it is never finalized here) is not a leak
// of the code under test.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpython\n"; }

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  PyPreConfig pre;
  PyPreConfig_InitIsolatedConfig(&pre);
  pre.allocator = PYMEM_ALLOCATOR_MALLOC;
  if (PyStatus_Exception(Py_PreInitialize(&pre))) return 2;
  PyConfig config;
  PyConfig_InitIsolatedConfig(&config);
  const PyStatus status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) return 2;
  return RUN_ALL_TESTS();
}
