# Writes OUT: a C++ file holding the text of IN (the GPU kernels) as a raw string literal, for
# NVRTC at run time. Run by the build whenever IN changes.
file(READ "${IN}" text)
file(WRITE "${OUT}" "// Generated from src/gpu/kernels.h by embed.cmake: do not edit.\n"
  "namespace stoker::image::gpu::internal {\n"
  "extern const char kKernelSource[];\n"
  "const char kKernelSource[] = R\"stoker_kernels(${text})stoker_kernels\";\n"
  "}  // namespace stoker::image::gpu::internal\n")
