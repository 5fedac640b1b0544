# The C++ contract is the boundary (issue 46), checked by ctest (bindings.include_only_public):
# - a binding (bindings/*.cc, *.h) includes, of the project's headers, only the public API
#   (include/stoker/..., as "stoker/...") and its own bindings.h, never a private header of
#   src/ (the extension's targets have no src/ on their include path either);
# - a test double's or benchmark helper's public header (include/stoker/testing/,
#   include/stoker/gpu/emulated.h, include/stoker/ffmpeg/decode_bound.h,
#   include/stoker/image/decode_only.h) is included only by the
#   testing bindings (testing*.cc, STOKER_TESTING only) and, in src/, by tests and by the test
#   doubles themselves, never by product code.
# Run: cmake -DROOT=<checkout> -P tools/check_includes.cmake
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<checkout> -P check_includes.cmake")
endif()
set(failures "")
set(test_only_re "^stoker/(testing/.*|gpu/emulated\\.h|ffmpeg/decode_bound\\.h|image/decode_only\\.h)$")

file(GLOB bindings ${ROOT}/bindings/*.cc ${ROOT}/bindings/*.h)
file(GLOB_RECURSE sources ${ROOT}/src/*.cc ${ROOT}/src/*.h ${ROOT}/include/*.h)
foreach(f IN LISTS bindings sources)
  file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  file(RELATIVE_PATH rel ${ROOT} ${f})
  get_filename_component(name ${f} NAME)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1" header "${line}")
    if(rel MATCHES "^bindings/")
      if(header STREQUAL "bindings.h")
        continue()
      elseif(NOT header MATCHES "^stoker/" OR NOT EXISTS ${ROOT}/include/${header})
        list(APPEND failures "${rel}: includes \"${header}\", not a header of include/stoker/")
        continue()
      endif()
      if(header MATCHES "${test_only_re}" AND NOT name MATCHES "^testing.*\\.cc$")
        list(APPEND failures "${rel}: includes the test double \"${header}\" outside testing*.cc")
      endif()
    elseif(header MATCHES "${test_only_re}")
      get_filename_component(stem ${f} NAME_WE)
      get_filename_component(header_stem ${header} NAME_WE)
      if(NOT (name MATCHES "_test\\.cc$" OR rel MATCHES "^src/testing/" OR
              rel MATCHES "^include/stoker/" OR stem STREQUAL header_stem OR
              name MATCHES "^emulated_backend"))
        list(APPEND failures "${rel}: product code includes the test double \"${header}\"")
      endif()
    endif()
  endforeach()
endforeach()

if(failures)
  list(JOIN failures "\n  " msg)
  message(FATAL_ERROR "include boundary broken:\n  ${msg}")
endif()
list(LENGTH bindings n)
message(STATUS "include boundary holds (${n} binding files)")
