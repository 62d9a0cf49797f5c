// XXH3 for AVX2 (compiled with -mavx2 where the compiler targets x86-64).
#include <cstddef>

#include "digest/xxh3_wide.h"

#if defined(__AVX2__)
#define DETAUDIT_XXH3_VECTOR XXH_AVX2
#define DETAUDIT_XXH3_ISA "avx2"
#define DETAUDIT_XXH3_BUILD xxh3_avx2
#include "digest/xxh3_wide_impl.h"
#else
namespace detaudit {
const Xxh3Wide* xxh3_avx2() { return nullptr; }
}  // namespace detaudit
#endif
