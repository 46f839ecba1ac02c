/* The oldest glibc the files we inject into containers load under: 2.17 (x86_64).
 *
 * Force-included (gcc -include) into the library, the simulated driver and the probe. A
 * reference to a glibc function binds to the newest version of it in the glibc we build
 * with (dlopen@GLIBC_2.34, stat@GLIBC_2.33 on a current distribution), and a preloaded
 * library asking for a version the container's glibc lacks stops every program of the
 * container. Each `.symver` below binds one function to its oldest version instead: glibc
 * keeps every old version, so one build loads under 2.17 through today. Functions that
 * moved from libdl/libpthread into libc in 2.34 still carry their old version there, and the
 * Makefile links libdl.so.2 and libpthread.so.0 so that older glibc finds them where they
 * were. stat/fstat have no old version at all (before 2.33 they were inline wrappers of
 * __xstat): src/rawstat.h calls the kernel instead.
 *
 * tests/hook/test_baseline.py reads the dynamic symbol tables and fails on any version newer
 * than 2.17, so a new call to a function missing here is caught. No #include: this header is
 * read before the source's own _GNU_SOURCE. */
#if defined(__x86_64__) && !defined(__ASSEMBLER__)
#define GS_PIN(sym, ver) __asm__(".symver " #sym "," #sym "@" ver);
GS_PIN(dlopen, "GLIBC_2.2.5")
#ifndef GS_EXPORTS_DLSYM /* the library defines its own dlsym (src/dlsym.c) */
GS_PIN(dlsym, "GLIBC_2.2.5")
#endif
GS_PIN(dlvsym, "GLIBC_2.2.5")
GS_PIN(dladdr, "GLIBC_2.2.5")
GS_PIN(dlerror, "GLIBC_2.2.5")
GS_PIN(dlclose, "GLIBC_2.2.5")
GS_PIN(pthread_once, "GLIBC_2.2.5")
GS_PIN(pthread_atfork, "GLIBC_2.2.5")
GS_PIN(pthread_key_create, "GLIBC_2.2.5")
GS_PIN(pthread_getspecific, "GLIBC_2.2.5")
GS_PIN(pthread_setspecific, "GLIBC_2.2.5")
GS_PIN(pthread_create, "GLIBC_2.2.5")
GS_PIN(pthread_join, "GLIBC_2.2.5")
GS_PIN(pthread_exit, "GLIBC_2.2.5")
GS_PIN(pthread_mutex_trylock, "GLIBC_2.2.5")
GS_PIN(pthread_mutex_timedlock, "GLIBC_2.2.5")
GS_PIN(pthread_mutexattr_init, "GLIBC_2.2.5")
GS_PIN(pthread_mutexattr_destroy, "GLIBC_2.2.5")
GS_PIN(pthread_mutexattr_setpshared, "GLIBC_2.2.5")
GS_PIN(pthread_mutexattr_settype, "GLIBC_2.2.5")
GS_PIN(pthread_mutexattr_setrobust, "GLIBC_2.12")
GS_PIN(pthread_mutex_consistent, "GLIBC_2.12")
#undef GS_PIN
#endif
