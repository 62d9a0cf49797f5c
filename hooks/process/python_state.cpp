#include "process/python_state.h"

#include <dlfcn.h>

#include <cstring>

namespace detaudit::hooks::python {
namespace {

using PyObject = void;
using PyFrame = void;

// The C API subset used here: all in CPython's stable ABI since 3.9 but Py_IsFinalizing (3.13;
// _Py_IsFinalizing before).
struct Api {
  int (*is_initialized)();
  int (*is_finalizing)();
  void* (*this_thread_state)();
  int (*gil_ensure)();
  void (*gil_release)(int);
  PyObject* (*import_module)(const char*);
  PyObject* (*get_attr)(PyObject*, const char*);
  PyObject* (*call_object)(PyObject*, PyObject*);
  const char* (*utf8)(PyObject*);
  void (*dec_ref)(PyObject*);
  void (*err_clear)();
  PyFrame* (*current_frame)();
  PyFrame* (*frame_back)(PyFrame*);
  PyObject* (*frame_code)(PyFrame*);
  PyObject* (*mapping_get)(PyObject*, const char*);
  long long (*as_long_long)(PyObject*);
  bool ok = false;
};

template <typename F>
bool resolve(F* out, const char* name) {
  *out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

const Api& api() {
  static const Api a = [] {
    Api x{};
    x.ok = resolve(&x.is_initialized, "Py_IsInitialized") &&
           (resolve(&x.is_finalizing, "Py_IsFinalizing") ||
            resolve(&x.is_finalizing, "_Py_IsFinalizing")) &&
           resolve(&x.this_thread_state, "PyGILState_GetThisThreadState") &&
           resolve(&x.gil_ensure, "PyGILState_Ensure") &&
           resolve(&x.gil_release, "PyGILState_Release") &&
           resolve(&x.import_module, "PyImport_ImportModule") &&
           resolve(&x.get_attr, "PyObject_GetAttrString") &&
           resolve(&x.call_object, "PyObject_CallObject") && resolve(&x.utf8, "PyUnicode_AsUTF8") &&
           resolve(&x.dec_ref, "Py_DecRef") && resolve(&x.err_clear, "PyErr_Clear") &&
           resolve(&x.current_frame, "PyEval_GetFrame") &&
           resolve(&x.frame_back, "PyFrame_GetBack") && resolve(&x.frame_code, "PyFrame_GetCode") &&
           resolve(&x.mapping_get, "PyMapping_GetItemString") &&
           resolve(&x.as_long_long, "PyLong_AsLongLong");
    return x;
  }();
  return a;
}

// Holds the GIL for a thread Python knows; usable() is false when it must not be taken.
class Gil {
 public:
  Gil() {
    const Api& a = api();
    if (!a.ok || !a.is_initialized() || a.is_finalizing() || !a.this_thread_state()) return;
    state_ = a.gil_ensure();
    held_ = true;
  }
  ~Gil() {
    if (held_) api().gil_release(state_);
  }
  bool usable() const { return held_; }

 private:
  int state_ = 0;
  bool held_ = false;
};

// A new reference, released at scope exit.
struct Ref {
  PyObject* p;
  explicit Ref(PyObject* o) : p(o) {}
  ~Ref() {
    if (p) api().dec_ref(p);
  }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

}  // namespace

bool host_is_python() { return dlsym(RTLD_DEFAULT, "Py_IsInitialized") != nullptr; }

bool exiting() {
  const Api& a = api();
  return a.ok && (!a.is_initialized() || a.is_finalizing());
}

std::optional<std::string> thread_name() {
  Gil gil;
  if (!gil.usable()) return std::nullopt;
  const Api& a = api();
  std::optional<std::string> name;
  Ref threading(a.import_module("threading"));
  Ref current(threading.p ? a.get_attr(threading.p, "current_thread") : nullptr);
  Ref thread(current.p ? a.call_object(current.p, nullptr) : nullptr);
  Ref value(thread.p ? a.get_attr(thread.p, "name") : nullptr);
  const char* s = value.p ? a.utf8(value.p) : nullptr;
  // "Dummy-<n>": a thread Python did not start, numbered in order of first contact.
  if (s && std::strncmp(s, "Dummy-", 6) != 0) name = s;
  a.err_clear();
  return name;
}

namespace {

// The integer local `local` of the innermost frame of function `function` (whose file ends with
// `file_suffix`, if given) on this thread's Python stack: nullopt when no such frame, -1 when the
// local is not set yet. With `also`, the address of that local's object too, into *address (0
// when unset), from the same frame's locals.
std::optional<int64_t> frame_local(const char* function, const char* file_suffix, const char* local,
                                   const char* also = nullptr, uintptr_t* address = nullptr) {
  Gil gil;
  if (!gil.usable()) return std::nullopt;
  const Api& a = api();
  std::optional<int64_t> found;
  PyFrame* frame = a.current_frame();  // borrowed
  if (!frame) return std::nullopt;
  Ref walk(nullptr);
  for (int depth = 0; frame && depth < 64; ++depth) {
    Ref code(a.frame_code(frame));
    Ref name(code.p ? a.get_attr(code.p, "co_name") : nullptr);
    const char* s = name.p ? a.utf8(name.p) : nullptr;
    bool match = s && std::strcmp(s, function) == 0;
    if (match && file_suffix) {
      Ref file(a.get_attr(code.p, "co_filename"));
      const char* f = file.p ? a.utf8(file.p) : nullptr;
      size_t n = f ? std::strlen(f) : 0, m = std::strlen(file_suffix);
      match = n >= m && std::strcmp(f + n - m, file_suffix) == 0;
    }
    if (match) {
      Ref locals(a.get_attr(frame, "f_locals"));
      Ref value(locals.p ? a.mapping_get(locals.p, local) : nullptr);
      found = value.p ? a.as_long_long(value.p) : -1;
      if (*found < -1) found = -1;
      if (also && address) {
        Ref other(locals.p ? a.mapping_get(locals.p, also) : nullptr);
        *address = reinterpret_cast<uintptr_t>(other.p);
      }
      break;
    }
    PyFrame* back = a.frame_back(frame);  // a new reference
    if (walk.p) a.dec_ref(walk.p);
    walk.p = back;
    frame = back;
  }
  a.err_clear();
  return found;
}

}  // namespace

std::optional<WorkerBatch> dataloader_batch() {
  // -1 before the loop's first batch. Its fetcher is made anew at each _ResumeIteration (the
  // next epoch of a persistent worker) while the old one is still held: consecutive epochs'
  // fetchers are never at one address.
  uintptr_t fetcher = 0;
  std::optional<int64_t> idx = frame_local("_worker_loop", nullptr, "idx", "fetcher", &fetcher);
  if (!idx) return std::nullopt;
  return WorkerBatch{*idx, fetcher};
}

std::optional<int64_t> spawn_index() {
  std::optional<int64_t> i = frame_local("_wrap", "torch/multiprocessing/spawn.py", "i");
  return i && *i >= 0 ? i : std::nullopt;
}

}  // namespace detaudit::hooks::python
