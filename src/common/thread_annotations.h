// Clang thread-safety annotations (-Wthread-safety); no-ops elsewhere.
//
// libstdc++'s std::mutex carries no `capability` attribute, so clang cannot
// check GUARDED_BY(std::mutex).  Guard members with ember::Mutex
// (common/mutex.h), which is annotated, and lock it with MutexLock.
#pragma once

#if defined(__clang__)
#define EMBER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define EMBER_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) EMBER_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY EMBER_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) EMBER_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) EMBER_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRE(...) EMBER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) EMBER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) EMBER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUSIVE_LOCKS_REQUIRED(...) EMBER_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) EMBER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_EXCLUSIVE_LOCK(...) EMBER_THREAD_ANNOTATION(assert_exclusive_lock(__VA_ARGS__))
#define RETURN_CAPABILITY(x) EMBER_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS EMBER_THREAD_ANNOTATION(no_thread_safety_analysis)
