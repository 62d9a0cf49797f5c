/* The library `detaudit run` preloads into the program and every process it starts.
 *
 * The interposer links libtorch: preloaded itself, it made every child load libtorch, a second
 * or more each (1-3 s with a CUDA torch), the compiler, assembler and linker of each of
 * torch.compile's C++ builds included, and Triton's ptxas. This shim depends on libc alone and
 * loads the interposer ($DETAUDIT_INTERPOSER) only into a process that can run torch: a Python,
 * or a program that links libtorch (mapped by the time constructors run). Everything else starts
 * as it would without detaudit.
 *
 * It also keeps the one symbol the interposer must interpose, _exit (forked DataLoader workers
 * leave through os._exit, skipping atexit): a library loaded with dlopen comes after libc in
 * the lookup order, a preloaded one before. The interposer registers its flush here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void (*flush_fn)(void);
static flush_fn g_flush_at_exit;

/* Called by the interposer once it is attached. */
EXPORT void detaudit_preload_flush_at_exit(flush_fn fn) { g_flush_at_exit = fn; }

EXPORT __attribute__((noreturn)) void _exit(int status) {
  typedef void (*exit_fn)(int);
  if (g_flush_at_exit) g_flush_at_exit();
  exit_fn real = (exit_fn)dlsym(RTLD_NEXT, "_exit");
  real(status);
  __builtin_unreachable();
}

static const char* base_name(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static int starts_with(const char* s, const char* prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int maps_torch_or_python(struct dl_phdr_info* info, size_t size, void* found) {
  (void)size;
  const char* name = base_name(info->dlpi_name ? info->dlpi_name : "");
  if (starts_with(name, "libtorch_cpu.so") || starts_with(name, "libtorch.so") ||
      starts_with(name, "libpython")) {
    *(int*)found = 1;
    return 1;
  }
  return 0;
}

/* A Python (by its executable's name, or libpython linked in), or a program that links libtorch.
 * When /proc cannot tell, yes: loading the interposer is what detaudit did before. */
static int can_run_torch(void) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 1;
  exe[n] = '\0';
  if (starts_with(base_name(exe), "python")) return 1;
  int found = 0;
  dl_iterate_phdr(maps_torch_or_python, &found);
  return found;
}

__attribute__((constructor)) static void load_interposer(void) {
  const char* run_dir = getenv("DETAUDIT_RUN_DIR");
  const char* interposer = getenv("DETAUDIT_INTERPOSER");
  if (!run_dir || !*run_dir || !interposer || !*interposer || !can_run_torch()) return;
  if (!dlopen(interposer, RTLD_NOW | RTLD_GLOBAL))
    fprintf(stderr,
            "detaudit: error: cannot load the interposer: %s; this process is not recorded\n",
            dlerror());
}
