// The fault guard; see fault_guard.hpp for what it is and how it differs from CUDA.
//
// Owns: the previous SIGSEGV/SIGBUS actions (to chain to), the per-thread guard pointer, and
// the process-wide fault totals.
// Invariants: the signal handler touches only async-signal-safe state: a lock-free atomic,
// the faulting thread's guard pointer, sigaction and raise. The guard pointer is read only
// while some guard is armed, and a thread's TLS block for it exists once run_guarded() has
// written it before arming. (A thread that never ran a guard and crashes while another
// thread's guard is armed may have its block allocated inside the handler: not
// async-signal-safe in principle, on a thread that is crashing anyway.) run_guarded() and
// copy_body() are C-style (and so are the test kernels' bodies): between sigsetjmp and the
// guard's end nothing with a destructor lives, so a siglongjmp out of them skips no cleanup.
#include "backend/fault_guard.hpp"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace vta {
namespace {

thread_local sigjmp_buf* t_guard = nullptr;  // this thread's armed guard, if any
std::atomic<int> g_armed{0};                 // guards armed on all threads (gates the TLS read)
std::atomic<uint64_t> g_kernel_faults{0}, g_copy_faults{0};
struct sigaction g_prev_segv, g_prev_bus;    // what was installed before us
std::once_flag g_install_once;

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

// Hand the signal to whatever handled it before the guard was installed, as if we were not here.
void chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = sig == SIGBUS ? g_prev_bus : g_prev_segv;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  bool sent = info == nullptr || info->si_code <= 0;  // kill(), raise(), sigqueue(): not a fault
  if (sent && !(prev.sa_flags & SA_SIGINFO) && prev.sa_handler == SIG_IGN) return;  // ignored, as before
  // SIG_DFL, or a real fault under SIG_IGN (the kernel never lets a fault be ignored: it kills):
  // restore the default and return, so the faulting instruction runs again and the default
  // action ends the process as it would have without the guard. A sent signal is re-raised
  // (blocked until this handler returns).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (sent) raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  int saved_errno = errno;
  if (g_armed.load(std::memory_order_relaxed) > 0 && info && info->si_code > 0) {
    sigjmp_buf* jb = t_guard;
    if (jb) {
      t_guard = nullptr;
      siglongjmp(*jb, 1);
    }
  }
  chain(sig, info, context);
  errno = saved_errno;
}

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

void copy_body(void* arg) {
  Copy* c = static_cast<Copy*>(arg);
  std::memmove(c->dst, c->src, c->bytes);
}

}  // namespace

bool run_guarded(void (*fn)(void*), void* arg) {
  sigjmp_buf jb;
  t_guard = nullptr;  // touch this thread's TLS block now, outside any signal context
  g_armed.fetch_add(1, std::memory_order_relaxed);
  if (sigsetjmp(jb, 0) != 0) {
    // Back from the handler: siglongjmp (savemask 0) left the signal blocked, as the kernel
    // blocks it while its handler runs; unblock it for this thread's next guard.
    g_armed.fetch_sub(1, std::memory_order_relaxed);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGSEGV);
    sigaddset(&set, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    return false;
  }
  t_guard = &jb;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  g_armed.fetch_sub(1, std::memory_order_relaxed);
  return true;
}


vta_kernel_counters_t KernelCounters::snapshot() const {
  vta_kernel_counters_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.kernels_launched = launched.load();
  c.kernels_completed = completed.load();
  c.kernels_faulted = faulted.load();
  c.copy_faults = copy_faults.load();
  c.bytes_checked = bytes_checked.load();
  c.bytes_mismatched = bytes_mismatched.load();
  return c;
}

void install_fault_guard() {
  std::call_once(g_install_once, [] {
    // Read the previous actions first, so the handler never sees them unset.
    sigaction(SIGSEGV, nullptr, &g_prev_segv);
    sigaction(SIGBUS, nullptr, &g_prev_bus);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

bool guarded_copy(KernelCounters& counters, void* dst, const void* src, size_t bytes) {
  Copy c{dst, src, bytes};
  if (run_guarded(copy_body, &c)) return true;
  counters.copy_faults++;
  g_copy_faults++;
  return false;
}

void count_kernel_fault() { g_kernel_faults++; }

void guarded_fault_totals(uint64_t* kernel_faults, uint64_t* copy_faults) {
  *kernel_faults = g_kernel_faults.load();
  *copy_faults = g_copy_faults.load();
}

}  // namespace vta
