# Common settings for whittle targets.
function(whittle_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}> $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:include/whittle> $<INSTALL_INTERFACE:include>)
  if(WHITTLE_CUDA)
    target_compile_definitions(${target} PUBLIC WHITTLE_WITH_CUDA=1)
  endif()
endfunction()

# whittle_add_module(<name> SOURCES ... HEADERS ... DEPENDS ...)
# Adds library whittle_<name> with alias whittle::<name>, using the shared precompiled header.
function(whittle_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;DEPENDS" ${ARGN})
  set(target whittle_${name})
  add_library(${target} ${ARG_SOURCES} ${ARG_HEADERS})
  add_library(whittle::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME whittle_${name} EXPORT_NAME ${name})
  whittle_target_defaults(${target})
  target_precompile_headers(${target} REUSE_FROM whittle_pch)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} ${ARG_DEPENDS})
  set_property(GLOBAL APPEND PROPERTY WHITTLE_EXPORTED_TARGETS ${target})
  install(FILES ${ARG_HEADERS} DESTINATION include/whittle/${name})
  set_property(GLOBAL APPEND PROPERTY WHITTLE_MODULES ${name})
endfunction()

# whittle_use_pch(<target>): reuse the shared precompiled header in an executable or test.
function(whittle_use_pch target)
  whittle_target_defaults(${target})
  target_precompile_headers(${target} REUSE_FROM whittle_pch)
endfunction()
