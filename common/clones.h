/* clones.h - one variant of a hot function per x86-64 level, picked at load time (GCC's
 * target_clones: an ifunc resolver reads CPUID), so a portable build still runs wide vectors
 * where the machine has them; and whether ThreadSanitizer instruments this build.
 *
 * No clones under ThreadSanitizer: the ifunc resolvers run during relocation, before the TSan
 * runtime is up, and the instrumented resolver crashes the process before main. x86-64 Linux
 * with a compiler that has the attribute (GCC, clang); elsewhere MFS_TARGET_CLONES(...)
 * expands to nothing and the baseline code runs. (libmfsnap adds a condition of its own:
 * snapshots/reader/snap_dot.c.)
 */
#ifndef MFS_CLONES_H
#define MFS_CLONES_H

#if defined(__SANITIZE_THREAD__)
#define MFS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MFS_UNDER_TSAN 1
#endif
#endif
#ifndef MFS_UNDER_TSAN
#define MFS_UNDER_TSAN 0
#endif

#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute) && !MFS_UNDER_TSAN
#if __has_attribute(target_clones)
#define MFS_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif
#endif
#ifndef MFS_TARGET_CLONES
#define MFS_TARGET_CLONES(...)
#endif

#endif
