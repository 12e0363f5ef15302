# install(EXPORT) with a version file: find_package(zero3) then target_link_libraries(app zero3::zero3).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS zero3 EXPORT zero3Targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS zero3_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/zero3" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES "${PROJECT_BINARY_DIR}/include/zero3/build_config.hpp" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zero3)
install(EXPORT zero3Targets NAMESPACE zero3:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/zero3Config.cmake.in"
                              "${PROJECT_BINARY_DIR}/zero3Config.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/zero3Config.cmake" "${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)
