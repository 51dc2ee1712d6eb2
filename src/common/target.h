/*
 * src/common/target.h - regions of functions built for an instruction set
 * the build does not assume, and the CPU checks that pick them at run
 * time, in words both GCC and clang take.
 *
 * A region (EMB_TARGET_BEGIN("avx2,fma") ... EMB_TARGET_END) gives every
 * function defined in it the target: the copies of one macro-made body,
 * one per vector width (rowfmt.c, table.c), where an attribute on each
 * would have to go through the macro. GCC says it with push_options and
 * target pragmas, clang with an attribute push; neither takes the other's.
 */
#ifndef EMB_COMMON_TARGET_H
#define EMB_COMMON_TARGET_H

#include <stdbool.h>

#define EMB_PRAGMA_(x) _Pragma(#x)

#if defined(__clang__)
#define EMB_TARGET_BEGIN(isa)                                                 \
	EMB_PRAGMA_(clang attribute push(__attribute__((target(isa))),        \
					 apply_to = function))
#define EMB_TARGET_END EMB_PRAGMA_(clang attribute pop)
#else
#define EMB_TARGET_BEGIN(isa)                                                 \
	EMB_PRAGMA_(GCC push_options) EMB_PRAGMA_(GCC target(isa))
#define EMB_TARGET_END EMB_PRAGMA_(GCC pop_options)
#endif

#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__)
#include <cpuid.h>

/* clang's __builtin_cpu_supports() has no "f16c": CPUID leaf 1, asked
 * once (in a guest CPUID traps to the hypervisor) and kept. */
static inline bool emb_cpu_f16c(void)
{
	static int has = -1;
	int h = __atomic_load_n(&has, __ATOMIC_RELAXED);

	if (h < 0) {
		unsigned a, b, c, d;

		h = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
		__atomic_store_n(&has, h, __ATOMIC_RELAXED);
	}
	return h;
}
#else
static inline bool emb_cpu_f16c(void)
{
	return __builtin_cpu_supports("f16c");
}
#endif
#endif

#endif
