/* The attributes every file of the library uses: what is exported, what is internal, branch
 * hints, and what must stay uninstrumented. */
#ifndef GPUSHARE_COMPILER_H
#define GPUSHARE_COMPILER_H

/* a hook: exported under the driver's name (everything else is hidden, -fvisibility=hidden) */
#define HOOK __attribute__((visibility("default")))
/* shared between the library's files, never exported (on declarations: direct, no GOT) */
#define GS_HIDDEN __attribute__((visibility("hidden")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
/* dlsym runs inside sanitizer start-up (ASan builds resolve their interceptors through it),
 * before shadow memory exists: that path must not be instrumented */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

#endif
