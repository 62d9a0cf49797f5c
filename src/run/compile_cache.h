// Each run's torch.compile caches. torch.compile records different ops when it compiles than when
// it loads, so two runs compare only if they start from the same cache. A run gets a fresh one
// of its own; a cache the user chose (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) is copied into
// the run directory as it is, so every run starts from the same copy and the user's is untouched.
#pragma once

#include <string>
#include <vector>

namespace detaudit::run {

// The environment variables naming a compile cache, with the folder a run's own is kept in under
// layout::compile_cache_path.
struct CompileCacheVariable {
  const char* name;
  const char* folder;
};
inline constexpr CompileCacheVariable kCompileCacheVariables[] = {
    {"TORCHINDUCTOR_CACHE_DIR", "torchinductor"},
    {"TRITON_CACHE_DIR", "triton"},
};

// Points each variable of `env` ("K=V" entries) at the run's own cache under `cache_root`:
// empty where the variable was unset; where it named a cache, a copy of it (hard links where the
// disk allows, else a copy of the bytes). Returns one line per cache it could not copy, whose run
// then starts empty.
std::vector<std::string> give_run_its_compile_caches(std::vector<std::string>* env,
                                                     const std::string& cache_root);

}  // namespace detaudit::run
