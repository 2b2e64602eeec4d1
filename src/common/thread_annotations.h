// Clang thread-safety annotations (-Wthread-safety); no-ops elsewhere.
#pragma once

#if defined(__clang__)
#define EMBER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define EMBER_THREAD_ANNOTATION(x)
#endif

#define GUARDED_BY(x) EMBER_THREAD_ANNOTATION(guarded_by(x))
#define EXCLUSIVE_LOCKS_REQUIRED(...) EMBER_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) EMBER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
