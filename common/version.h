// The spgate version, as project() in the top-level CMakeLists.txt sets it (the build
// passes it in as SPGATE_VERSION), so `spgated --version`, spgate_build_info and the C
// API's spgate_version() can never disagree with the build.
#ifndef SPGATE_COMMON_VERSION_H_
#define SPGATE_COMMON_VERSION_H_

#include <string_view>

#ifndef SPGATE_VERSION
#error "SPGATE_VERSION is set by CMake (spgate::common); build through CMake"
#endif

namespace spgate {

inline constexpr std::string_view kVersion = SPGATE_VERSION;

}  // namespace spgate

#endif  // SPGATE_COMMON_VERSION_H_
