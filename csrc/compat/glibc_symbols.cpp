// Older symbol versions for the core library, so that one wheel built on a current Linux loads
// on glibc 2.28 / GCC 8's libstdc++ (manylinux_2_28: RHEL 8 and later). docs/packaging.md.
//
// Owns: the wrappers setup.py's linker flags (--wrap=SYMBOL, only with VTA_GLIBC_COMPAT, on
// x86_64 glibc) send the core's references to. Each calls the same function under the version
// glibc 2.28 / libstdc++ 6.0.25 export (every one of them is still exported, as a compat
// symbol, by today's libraries), or stands in for one those libraries do not have:
//  - dlopen, dlsym, dladdr, dlclose, pthread_once (GLIBC_2.34: moved into libc), pthread_sigmask
//    (2.32), log2 (2.29): the GLIBC_2.2.5 versions, the same functions;
//  - std::condition_variable::wait (GLIBCXX_3.4.30, GCC 12 versioned it anew): GLIBCXX_3.4.11's;
//  - fstat (GLIBC_2.33: before it, an inline calling __fxstat): __fxstat(_STAT_VER = 1);
//  - std::__throw_bad_array_new_length (GLIBCXX_3.4.29, GCC 11 headers call it): throws
//    std::bad_array_new_length, as libstdc++'s does;
//  - __libc_single_threaded (GLIBC_2.32, read by GCC 11+ headers to skip atomics): a hidden 0
//    of our own, so reference counts always use atomics (what older glibc's programs do).
// Invariants: compiled to nothing without VTA_GLIBC_COMPAT (the sanitizer and test builds,
// other platforms); every wrapper is hidden (nothing here is exported); no behaviour changes.
#if defined(VTA_GLIBC_COMPAT) && defined(__linux__)
#include <features.h>  // defines __GLIBC__ on glibc
#endif
#if defined(VTA_GLIBC_COMPAT) && defined(__x86_64__) && defined(__GLIBC__)

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <new>

#define VTA_HIDDEN extern "C" __attribute__((visibility("hidden")))

// The real functions, bound to the old versions by name (".symver local, name@VERSION").
__asm__(".symver vta_old_dlopen, dlopen@GLIBC_2.2.5");
__asm__(".symver vta_old_dlsym, dlsym@GLIBC_2.2.5");
__asm__(".symver vta_old_dladdr, dladdr@GLIBC_2.2.5");
__asm__(".symver vta_old_dlclose, dlclose@GLIBC_2.2.5");
__asm__(".symver vta_old_pthread_once, pthread_once@GLIBC_2.2.5");
__asm__(".symver vta_old_pthread_sigmask, pthread_sigmask@GLIBC_2.2.5");
__asm__(".symver vta_old_log2, log2@GLIBC_2.2.5");
__asm__(".symver vta_old_fxstat, __fxstat@GLIBC_2.2.5");
__asm__(".symver vta_old_cv_wait, _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");

extern "C" {
void* vta_old_dlopen(const char*, int);
void* vta_old_dlsym(void*, const char*);
int vta_old_dladdr(const void*, Dl_info*);
int vta_old_dlclose(void*);
int vta_old_pthread_once(pthread_once_t*, void (*)(void));
int vta_old_pthread_sigmask(int, const sigset_t*, sigset_t*);
double vta_old_log2(double);
int vta_old_fxstat(int, int, struct stat*);
void vta_old_cv_wait(void*, void*);
}

VTA_HIDDEN void* __wrap_dlopen(const char* file, int mode) { return vta_old_dlopen(file, mode); }
VTA_HIDDEN void* __wrap_dlsym(void* handle, const char* name) { return vta_old_dlsym(handle, name); }
VTA_HIDDEN int __wrap_dladdr(const void* addr, Dl_info* info) { return vta_old_dladdr(addr, info); }
VTA_HIDDEN int __wrap_dlclose(void* handle) { return vta_old_dlclose(handle); }
VTA_HIDDEN int __wrap_pthread_once(pthread_once_t* once, void (*init)(void)) {
  return vta_old_pthread_once(once, init);
}
VTA_HIDDEN int __wrap_pthread_sigmask(int how, const sigset_t* set, sigset_t* old) {
  return vta_old_pthread_sigmask(how, set, old);
}
VTA_HIDDEN double __wrap_log2(double x) { return vta_old_log2(x); }
VTA_HIDDEN int __wrap_fstat(int fd, struct stat* buf) { return vta_old_fxstat(1, fd, buf); }  // _STAT_VER_LINUX
// A member function's this pointer is its first argument: the same call as (cv, lock).
VTA_HIDDEN void __wrap__ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE(void* cv, void* lock) {
  vta_old_cv_wait(cv, lock);
}
VTA_HIDDEN [[noreturn]] void __wrap__ZSt28__throw_bad_array_new_lengthv() { throw std::bad_array_new_length(); }
extern "C" {
__attribute__((visibility("hidden"))) char __wrap___libc_single_threaded = 0;
}

#endif
