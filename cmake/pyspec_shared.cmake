# libpyspec: the C API over the engine, its install rules and package files (included from the
# top-level CMakeLists.txt when PYSPEC_BUILD_SHARED is on).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The C API's version, read from the header so that the two cannot disagree.
file(STRINGS include/pyspec.h PYSPEC_VERSION_LINES REGEX "^#define PYSPEC_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*PYSPEC_VERSION_${part} ([0-9]+).*" "\\1" PYSPEC_C_API_${part} "${PYSPEC_VERSION_LINES}")
endforeach()
set(PYSPEC_C_API_VERSION "${PYSPEC_C_API_MAJOR}.${PYSPEC_C_API_MINOR}.${PYSPEC_C_API_PATCH}")

add_library(pyspec SHARED engine/src/c_api.cpp)
target_include_directories(pyspec PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(pyspec PRIVATE spec)
target_compile_options(pyspec PRIVATE -Wall -Wextra)
target_link_options(pyspec PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/cmake/libpyspec.map"
                                   "LINKER:--no-undefined")
# The libllama it was built against (llama-cpp-python's), found again at run time through the
# run path, so that an application links libpyspec alone.
get_target_property(PYSPEC_LLAMA_LIBRARY llama IMPORTED_LOCATION)
get_filename_component(PYSPEC_LLAMA_LIBDIR "${PYSPEC_LLAMA_LIBRARY}" DIRECTORY)
set_target_properties(pyspec PROPERTIES
  VERSION ${PYSPEC_C_API_VERSION}
  SOVERSION ${PYSPEC_C_API_MAJOR}
  PUBLIC_HEADER include/pyspec.h
  INSTALL_RPATH "${PYSPEC_LLAMA_LIBDIR}"
  LINK_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/cmake/libpyspec.map")
add_library(pyspec::pyspec ALIAS pyspec)

install(TARGETS pyspec EXPORT pyspecTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(PYSPEC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pyspec)
install(EXPORT pyspecTargets NAMESPACE pyspec:: DESTINATION ${PYSPEC_CMAKE_DIR})
configure_package_config_file(cmake/pyspecConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/pyspecConfig.cmake
  INSTALL_DESTINATION ${PYSPEC_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pyspecConfigVersion.cmake
  VERSION ${PYSPEC_C_API_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pyspecConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/pyspecConfigVersion.cmake
  DESTINATION ${PYSPEC_CMAKE_DIR})

# prefix relative to the .pc file, so that an installed tree can move.
file(RELATIVE_PATH PYSPEC_PC_UP "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(PYSPEC_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(PYSPEC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(PYSPEC_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(PYSPEC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/pyspec.pc.in ${CMAKE_CURRENT_BINARY_DIR}/pyspec.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pyspec.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
