// XXH3 for AVX-512F (compiled with -mavx512f where the compiler targets x86-64).
#include <cstddef>

#include "digest/xxh3_wide.h"

#if defined(__AVX512F__)
#define DETAUDIT_XXH3_VECTOR XXH_AVX512
#define DETAUDIT_XXH3_ISA "avx512"
#define DETAUDIT_XXH3_BUILD xxh3_avx512
#include "digest/xxh3_wide_impl.h"
#else
namespace detaudit {
const Xxh3Wide* xxh3_avx512() { return nullptr; }
}  // namespace detaudit
#endif
