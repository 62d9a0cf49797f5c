// hooks/process: what a process and its threads are: names that pair across runs, what Python
// knows, the environment fingerprint and the determinism settings applied.
//
// Names that pair a stream with its counterpart in another run, whatever the scheduler did.
//
// A process is "r<rank>.<role>": role "main"; "<parent role>.<k>" for the k-th child it forked
// (a DataLoader forks its workers in order); "<parent role>.<program>" for a recorded child it
// started (torch.compile's workers), named by what it runs. A thread within it is "main", its
// Python name ("Thread-1 (work)"), its own name when a library set one ("pt_autograd_0"), else
// "thread". Names that still clash take "~<k>" in the order they are claimed, and no two
// processes or threads ever write the same file: a name is claimed by creating its file.
#pragma once

#include <string>

namespace detaudit::hooks {

struct ThreadIdentity {
  std::string name;  // for its stream, file-safe
  // The DataLoader's pin-memory thread: it pins batches in the order they arrive, which is up
  // to the workers' timing. Its ops move bytes that are compared where they are read.
  bool moves_batches = false;
};
ThreadIdentity thread_identity();

// The role of a process started (fork and exec) by a recorded parent of the same rank.
std::string exec_child_role(const std::string& parent_role);

// Creates <dir>/<stem><ext>, or <dir>/<stem>~<k><ext> for the first free k; returns the file
// descriptor (-1 on failure) and the stem it got in *claimed.
int create_exclusive(const std::string& dir, const std::string& stem, const std::string& ext,
                     std::string* claimed);

// Letters, digits and ._- kept; anything else becomes '_'.
std::string file_safe(const std::string& s);

}  // namespace detaudit::hooks
