// Registration functions of the Python extension, one per subsystem (see module.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace stoker::python {

namespace nb = nanobind;

void register_errors(nb::module_& m);
void register_sources(nb::module_& m);
void register_loader(nb::module_& m);
void register_images(nb::module_& m);
void register_tune(nb::module_& m);
void register_order(nb::module_& m);
void register_workers(nb::module_& m);
void register_seeding(nb::module_& m);

}  // namespace stoker::python
