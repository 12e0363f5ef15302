# install(EXPORT) with a version file: find_package(zero3) then target_link_libraries(app zero3::zero3).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Installed programs find libzero3 beside them, as bin/../lib, wherever the tree is installed or moved to
# (an RPATH of $ORIGIN/../lib); the library and the programs also keep the directories of the libraries they
# link outside the system's (CUDA's cuBLAS, NCCL). Nothing needs LD_LIBRARY_PATH.
file(RELATIVE_PATH ZERO3_BIN_TO_LIB "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
function(zero3_install_program target)
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${ZERO3_BIN_TO_LIB}" INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()
set_target_properties(zero3 PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS zero3 EXPORT zero3Targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
zero3_install_program(zero3_cli)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/zero3" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES "${PROJECT_BINARY_DIR}/include/zero3/build_config.hpp" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zero3)
install(EXPORT zero3Targets NAMESPACE zero3:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)
# The build tree is a package too (CMAKE_PREFIX_PATH or zero3_DIR pointing at it): its config includes these.
export(EXPORT zero3Targets NAMESPACE zero3:: FILE "${PROJECT_BINARY_DIR}/zero3Targets.cmake")
# The libtorch component's config finds the libtorch the adapter was built with unless the consumer names one.
set(ZERO3_TORCH_DIR "")
if(ZERO3_HAVE_LIBTORCH AND Torch_DIR)
  set(ZERO3_TORCH_DIR "${Torch_DIR}")
endif()
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/zero3Config.cmake.in"
                              "${PROJECT_BINARY_DIR}/zero3Config.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/zero3Config.cmake" "${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)

# pkg-config, relocatable like the rest: its prefix is found from the .pc file's own directory.
file(RELATIVE_PATH ZERO3_PC_TO_PREFIX "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" ZERO3_PC_TO_PREFIX "${ZERO3_PC_TO_PREFIX}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/zero3.pc.in" "${PROJECT_BINARY_DIR}/zero3.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/zero3.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
