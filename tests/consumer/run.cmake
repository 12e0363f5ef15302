# The installed package, used as a user outside the tree would: installs the build tree into
# BUILD_DIR/consumer-install, checks that the installed programs start with an empty environment (their RPATH
# finds libzero3, no LD_LIBRARY_PATH), builds tests/consumer against the installation with find_package(zero3)
# and trains it on 2 ranks started by the installed `zero3 launch`, then builds the same program with the
# installed pkg-config file (when PKG_CONFIG is given) and runs it on 1 rank. tests/libtorch/consumer (find_package(zero3
# COMPONENTS libtorch)) runs through it too.
#   BUILD_DIR, SOURCE_DIR (tests/consumer), GENERATOR, CXX (the compiler), LIBDIR (CMAKE_INSTALL_LIBDIR),
#   PKG_CONFIG (the pkg-config program; empty: that part is skipped), NAME (default consumer: the installation
#   and the consumer's build are BUILD_DIR/NAME-install and BUILD_DIR/NAME-build)
if(NOT NAME)
  set(NAME consumer)
endif()
set(prefix "${BUILD_DIR}/${NAME}-install")
set(work "${BUILD_DIR}/${NAME}-build")
file(REMOVE_RECURSE "${prefix}" "${work}")

# Runs a command with nothing in the environment but PATH; fails the test unless it exits 0 and, when
# EXPECT is given, prints it.
function(run_clean what)
  cmake_parse_arguments(arg "" "EXPECT" "COMMAND" ${ARGN})
  execute_process(COMMAND env -i PATH=/usr/local/bin:/usr/bin:/bin ${arg_COMMAND}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${what}:\n${out}")
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}) with an empty environment:\n${err}")
  endif()
  if(arg_EXPECT AND NOT out MATCHES "${arg_EXPECT}")
    message(FATAL_ERROR "${what}: expected output matching '${arg_EXPECT}'\n${err}")
  endif()
endfunction()

execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" RESULT_VARIABLE rc
                OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()

run_clean("installed zero3 version" COMMAND "${prefix}/bin/zero3" version EXPECT "zero3 ")
if(EXISTS "${prefix}/bin/llama3_train")
  run_clean("installed llama3_train --version" COMMAND "${prefix}/bin/llama3_train" --version EXPECT "llama3_train")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${work}" -G "${GENERATOR}"
                        "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${prefix}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer against ${prefix} failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${work}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
run_clean("the consumer (find_package) on 2 ranks"
          COMMAND "${prefix}/bin/zero3" launch -n 2 -- "${work}/consumer" "${SOURCE_DIR}/ds_config.json"
          EXPECT "2 rank\\(s\\), stage 3, gloo;.*: ok")

if(PKG_CONFIG)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig"
                          "${PKG_CONFIG}" --cflags --libs zero3
                  RESULT_VARIABLE rc OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config --cflags --libs zero3 failed against ${prefix}/${LIBDIR}/pkgconfig: ${rc}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  execute_process(COMMAND "${CXX}" -std=c++20 "${SOURCE_DIR}/main.cpp" -o "${work}/consumer-pkgconfig" ${flags}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the consumer with pkg-config's flags (${flags}) failed: ${rc}")
  endif()
  run_clean("the consumer (pkg-config) on 1 rank"
            COMMAND "${prefix}/bin/zero3" launch -n 1 -- "${work}/consumer-pkgconfig" "${SOURCE_DIR}/ds_config.json"
            EXPECT "1 rank\\(s\\), stage 3, gloo;.*: ok")
endif()
