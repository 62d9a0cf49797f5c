# Compiler settings and dependencies shared by the top-level project and hooks/ (one per torch).
# libtorch's RecordFunction layout depends on NDEBUG: never build Debug against a release libtorch.
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "" FORCE)
endif()
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra;-Wno-unused-parameter>")  # not nvcc's
# Line tables only (-g1): backtraces keep their files and lines, and the build takes 16-29% less
# CPU a file than with full debug info (measured on the core's batches and the recorder).
string(APPEND CMAKE_CXX_FLAGS_RELWITHDEBINFO " -DNDEBUG -O2 -g1")
# The code's contracts (DETAUDIT_DCHECK, src/util/check.h) are checked in the builds the tests
# run and in sanitizer builds; a user's install leaves them out.
option(DETAUDIT_CHECKS "Check the code's contracts (on in builds with the tests)" OFF)
if(DETAUDIT_CHECKS OR DETAUDIT_SANITIZE)
  add_compile_definitions(DETAUDIT_CHECKS)
endif()
# A sanitizer build (tests/sanitize.sh): DETAUDIT_SANITIZE=address,undefined instruments every
# target, the interposer's too when hooks/ is built with it. Any finding stops the program.
set(DETAUDIT_SANITIZE "" CACHE STRING "-fsanitize= list for every target, e.g. address,undefined")
if(DETAUDIT_SANITIZE)
  add_compile_options(-fsanitize=${DETAUDIT_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DETAUDIT_SANITIZE})
endif()

# A missing library stops the configure with one line naming the Debian package that has it
# (`pip install .` shows CMake's output; that line is the one to read). The leading space keeps
# CMake from wrapping it.
macro(detaudit_require found debian_package)
  if(NOT ${found})
    message(FATAL_ERROR " detaudit: missing build dependency: install Debian's ${debian_package} "
            "(sudo apt-get install ${debian_package}), then build again")
  endif()
endmacro()
find_package(OpenSSL QUIET)
detaudit_require(OpenSSL_FOUND libssl-dev)
find_package(nlohmann_json 3.10 QUIET)
detaudit_require(nlohmann_json_FOUND nlohmann-json3-dev)
find_package(fmt QUIET)
detaudit_require(fmt_FOUND libfmt-dev)
find_package(PkgConfig QUIET)
detaudit_require(PkgConfig_FOUND pkg-config)
pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
detaudit_require(XXHASH_FOUND libxxhash-dev)
include(GNUInstallDirs)
