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
string(APPEND CMAKE_CXX_FLAGS_RELWITHDEBINFO " -DNDEBUG -O2")
# A sanitizer build (tests/sanitize.sh): DETAUDIT_SANITIZE=address,undefined instruments every
# target, the interposer's too when hooks/ is built with it. Any finding stops the program.
set(DETAUDIT_SANITIZE "" CACHE STRING "-fsanitize= list for every target, e.g. address,undefined")
if(DETAUDIT_SANITIZE)
  add_compile_options(-fsanitize=${DETAUDIT_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DETAUDIT_SANITIZE})
endif()

find_package(OpenSSL REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
include(GNUInstallDirs)
