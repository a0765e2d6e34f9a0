# `cmake --install` + `find_package(wrapcert)` for consumers, with namespaced targets:
# wrapcert::core, wrapcert::io, wrapcert::gen, wrapcert::certify, wrapcert::fixtures,
# wrapcert::python (certification on real PyTorch, with the worker's Python files in
# share/wrapcert/python), wrapcert::plugin (what a MODULE library of wrapper kinds builds
# against), and the CLI. Each library installs its HEADERS file set: its public API, no
# `detail/` header.
include(CMakePackageConfigHelpers)

set(WRAPCERT_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/wrapcert")

set(_wrapcert_targets wrapcert_core wrapcert_io wrapcert_gen wrapcert_certify wrapcert_fixtures
                      wrapcert_python wrapcert_plugin)
if(TARGET wrapcert_cli)
  list(APPEND _wrapcert_targets wrapcert_cli)
endif()
install(TARGETS ${_wrapcert_targets}
  EXPORT wrapcertTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
  FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/tools/python/"
  DESTINATION "${CMAKE_INSTALL_DATADIR}/wrapcert/python" FILES_MATCHING PATTERN "wrapcert_*.py")
install(EXPORT wrapcertTargets NAMESPACE wrapcert:: DESTINATION "${WRAPCERT_CMAKE_DIR}")

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/wrapcertConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/wrapcertConfig.cmake" INSTALL_DESTINATION "${WRAPCERT_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/wrapcertConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/wrapcertConfig.cmake"
  "${PROJECT_BINARY_DIR}/wrapcertConfigVersion.cmake" DESTINATION "${WRAPCERT_CMAKE_DIR}")
