# kiln_add_plugin(<name> SOURCES <src>...)
# Builds a kiln plugin the way every plugin is built, in-tree or out of tree: a MODULE library named
# kiln-<name>, hidden visibility (only the descriptor alias is exported), linked against kiln::core.
function(kiln_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "kiln_add_plugin(${name}): SOURCES is required")
  endif()
  set(target kiln-plugin-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET kiln::core)
    target_link_libraries(${target} PRIVATE kiln::core ${ARG_LIBRARIES})
  else()
    target_link_libraries(${target} PRIVATE kiln_core ${ARG_LIBRARIES})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME kiln-${name}
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED KILN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${KILN_PLUGIN_OUTPUT_DIR})
  endif()
endfunction()
