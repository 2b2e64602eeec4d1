cmake_policy(SET CMP0057 NEW)  # IN_LIST
# Checks the includes of one layer of the core (see ember_layer in src/CMakeLists.txt).
# Run as: cmake -DLAYER=<layer> -DALLOWED=<layers> -DHEADER_LAYERS=<name=layer;...> (lists by ; or ,)
#               -DFILES=<files> -DSTAMP=<file> -P check_layer.cmake
# A file may include "<layer>/..." (internal) or "ember/<name>.h" (public) only where that
# layer is in ALLOWED.  Fails naming every offending file and include; else touches STAMP.
string(REPLACE "," ";" HEADER_LAYERS "${HEADER_LAYERS}")  # either separator
string(REPLACE "," ";" ALLOWED "${ALLOWED}")
set(wrong "")
foreach(file IN LISTS FILES)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "\"(([a-z_]+)/([a-z_/]+)\\.h)\"")
      continue()
    endif()
    set(included "${CMAKE_MATCH_1}")
    set(top "${CMAKE_MATCH_2}")
    set(rest "${CMAKE_MATCH_3}")
    if(top STREQUAL "ember")
      set(layer "")
      foreach(pair IN LISTS HEADER_LAYERS)
        if(pair MATCHES "^${rest}=(.+)$")
          set(layer "${CMAKE_MATCH_1}")
        endif()
      endforeach()
      if(layer STREQUAL "")
        string(APPEND wrong "\n  ${file} includes \"${included}\", a public header no layer declares (PUBLIC_HEADERS)")
        continue()
      endif()
    else()
      set(layer "${top}")
    endif()
    if(NOT layer IN_LIST ALLOWED)
      string(APPEND wrong "\n  ${file} includes \"${included}\" (layer ${layer})")
    endif()
  endforeach()
endforeach()
if(NOT wrong STREQUAL "")
  string(REPLACE ";" ", " allowed_text "${ALLOWED}")
  message(FATAL_ERROR "An include crosses the core's layers the wrong way:${wrong}\n"
                      "Layer ${LAYER} may include only headers of: ${allowed_text}.  Move the code to the "
                      "layer that owns what it needs, or declare the dependency in src/CMakeLists.txt if it "
                      "points down (ember_layer ... DEPS).")
endif()
file(TOUCH "${STAMP}")
