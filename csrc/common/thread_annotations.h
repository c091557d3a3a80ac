// Clang thread-safety annotations (after LevelDB's and Abseil's thread_annotations.h).
//
// Under clang they expand to the attributes that `-Wthread-safety` checks at compile time:
// a member marked GUARDED_BY(mu_) may be read or written only with mu_ held, a function
// marked REQUIRES(mu_) may be called only with it held, EXCLUDES(mu_) only without it.
// Other compilers (g++ builds the extension) see nothing. The mutex these name must be a
// CAPABILITY type (common/mutex.h): libstdc++'s std::mutex is not annotated, so locks of
// it are invisible to the analysis. scripts/sanitize.sh runs the check (its `tsa` build).
#pragma once

#if defined(__clang__)
#define MTRAINS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MTRAINS_THREAD_ANNOTATION(x)
#endif

// A type whose instances are locks ("mutex").
#define CAPABILITY(x) MTRAINS_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a capability from construction to destruction.
#define SCOPED_CAPABILITY MTRAINS_THREAD_ANNOTATION(scoped_lockable)
// A data member read and written only with the capability held.
#define GUARDED_BY(x) MTRAINS_THREAD_ANNOTATION(guarded_by(x))
// The caller must hold the capabilities.
#define REQUIRES(...) MTRAINS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the capabilities (the function takes them).
#define EXCLUDES(...) MTRAINS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes the capabilities and returns holding them.
#define ACQUIRE(...) MTRAINS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// The function releases capabilities the caller held.
#define RELEASE(...) MTRAINS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
