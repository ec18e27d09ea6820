# Common settings for whittle targets that are not modules (the precompiled header, tests,
# benchmarks, the command-line program).
function(whittle_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>)
  if(WHITTLE_CUDA)
    target_compile_definitions(${target} PUBLIC WHITTLE_WITH_CUDA=1)
  endif()
endfunction()

# whittle_add_module(<name> SOURCES ... HEADERS ... [INTERNAL_HEADERS ...] DEPENDS ...)
# Adds library whittle_<name> with alias whittle::<name>, using the shared precompiled header.
#
# The layering of ../shared/DESIGN.md is enforced by include directories, not by convention: a
# module compiles against its own folder and the public headers of the modules it DEPENDS on,
# nothing else. Each module gets a view ${CMAKE_BINARY_DIR}/include/<name>/<name>/ holding links
# to its HEADERS (public, installed) and INTERNAL_HEADERS (visible to the whittle modules that
# depend on it, not installed); headers in neither list are private to the module. So
# `#include "fuse/detail.h"` from quantize/ does not compile.
function(whittle_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;INTERNAL_HEADERS;DEPENDS" ${ARGN})
  set(target whittle_${name})
  add_library(${target} ${ARG_SOURCES} ${ARG_HEADERS} ${ARG_INTERNAL_HEADERS})
  add_library(whittle::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME whittle_${name} EXPORT_NAME ${name})
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(WHITTLE_CUDA)
    target_compile_definitions(${target} PUBLIC WHITTLE_WITH_CUDA=1)
  endif()
  set(_view "${CMAKE_BINARY_DIR}/include/${name}")
  set(_own "${CMAKE_BINARY_DIR}/include/${name}-private")
  file(REMOVE_RECURSE "${_view}" "${_own}")
  file(MAKE_DIRECTORY "${_view}/${name}" "${_own}")
  foreach(h IN LISTS ARG_HEADERS ARG_INTERNAL_HEADERS)
    get_filename_component(_base "${h}" NAME)
    file(CREATE_LINK "${CMAKE_CURRENT_SOURCE_DIR}/${h}" "${_view}/${name}/${_base}" SYMBOLIC)
  endforeach()
  file(CREATE_LINK "${CMAKE_CURRENT_SOURCE_DIR}" "${_own}/${name}" SYMBOLIC)
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${_view}> $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>
           $<INSTALL_INTERFACE:include/whittle> $<INSTALL_INTERFACE:include>
    PRIVATE "${_own}")
  whittle_precompile_headers(${target} REUSE_FROM whittle_pch)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} ${ARG_DEPENDS})
  set_property(GLOBAL APPEND PROPERTY WHITTLE_EXPORTED_TARGETS ${target})
  install(FILES ${ARG_HEADERS} DESTINATION include/whittle/${name})
  set_property(GLOBAL APPEND PROPERTY WHITTLE_MODULES ${name})
endfunction()

# whittle_precompile_headers(<args>...): target_precompile_headers(<args>...) when WHITTLE_PCH is on.
function(whittle_precompile_headers)
  if(WHITTLE_PCH)
    target_precompile_headers(${ARGN})
  endif()
endfunction()

# whittle_use_pch(<target> [WHITE_BOX]): reuse the shared precompiled header in an executable or
# test. WHITE_BOX (tests, benchmarks) adds the source root, so the target may include any header,
# private ones too; without it the target sees only the public headers of what it links.
function(whittle_use_pch target)
  cmake_parse_arguments(ARG "WHITE_BOX" "" "" ${ARGN})
  whittle_target_defaults(${target})
  if(ARG_WHITE_BOX)
    target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR})
  endif()
  whittle_precompile_headers(${target} REUSE_FROM whittle_pch)
endfunction()

# whittle_add_cuda_objects(<target> <source.cu>...): an object library of torch-free CUDA kernels
# for the GPUs of WHITTLE_CUDA_ARCHITECTURES, compiled with -fmad=false (every product and sum
# rounded on its own, so that the kernels give the bits of ATen's one-op-a-kernel forms and of the
# host runs of their bodies in the tests). Link it as $<TARGET_OBJECTS:<target>>.
function(whittle_add_cuda_objects target)
  add_library(${target} OBJECT ${ARGN})
  target_include_directories(${target} PRIVATE "${CMAKE_SOURCE_DIR}")
  target_compile_options(${target} PRIVATE -fmad=false)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17
                        CUDA_ARCHITECTURES "${WHITTLE_CUDA_ARCHITECTURES}")
endfunction()
