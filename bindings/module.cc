// The extension module stoker._native; `stoker/__init__.py` re-exports the public names.
#include "bindings.h"

NB_MODULE(_native, m) {
  m.doc() = "Stoker's native engine";
  stoker::python::register_errors(m);
  stoker::python::register_sources(m);
  stoker::python::register_loader(m);
  stoker::python::register_images(m);
  stoker::python::register_tune(m);
  stoker::python::register_order(m);
  stoker::python::register_workers(m);
  stoker::python::register_seeding(m);
  stoker::python::register_gpu(m);
  stoker::python::register_stratified(m);
  stoker::python::register_gpu_decode(m);
}
