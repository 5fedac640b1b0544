// The extension module stoker._native: one submodule per wing of src/ (src/README.md), each filled
// by that wing's registration file (engine.cc, sources.cc, ...). Exceptions are translated for the
// whole module (errors.cc); their Python types live in stoker.errors. `stoker/__init__.py`
// re-exports the public names.
#include "bindings.h"

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "Stoker's native engine";
  // Batches are exported zero-copy: a tensor the program still holds at exit may outlive this
  // module's teardown (torch frees it later). That is not a leak of the bindings.
  nb::set_leak_warnings(false);
  stoker::python::register_errors(m);
  stoker::python::register_build_info(m);
  // In dependency order: a class's base is registered before it (ImageSource: Source).
  nb::module_ engine = m.def_submodule("engine", "The loader, orders, sample keys");
  nb::module_ sources = m.def_submodule("sources", "Native sources: arrays, tokens, images");
  nb::module_ image = m.def_submodule("image", "CPU image pipelines and decoding");
  nb::module_ gpu = m.def_submodule("gpu", "The CUDA driver, batch fences, GPU JPEG decode");
  nb::module_ tuning = m.def_submodule("tuning", "The tuner and diagnosis");
  nb::module_ pydata = m.def_submodule("pydata", "Support for Python datasets");
  nb::module_ remote = m.def_submodule("remote", "The shard cache of remote datasets");
  stoker::python::register_engine(engine);
  stoker::python::register_budget(engine);
  stoker::python::register_sources(sources);
  stoker::python::register_image(image);
  stoker::python::register_gpu(gpu);
  stoker::python::register_tuning(tuning);
  stoker::python::register_pydata(pydata);
  stoker::python::register_remote(remote);
#ifdef STOKER_TESTING
  nb::module_ testing = m.def_submodule("testing", "Test doubles and benchmark helpers");
  stoker::python::register_testing(testing);
#endif
}
