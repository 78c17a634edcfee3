#include "textflag.h"

// func streamLines(dst, src *byte, n uintptr)
// dst 64-byte aligned, n a positive multiple of 64. Unaligned loads (MOVOU),
// non-temporal stores (MOVNTO = MOVNTDQ). No fence: see fence.
TEXT ·streamLines(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	SHRQ	$6, CX
loop:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	32(SI), X2
	MOVOU	48(SI), X3
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	ADDQ	$64, SI
	ADDQ	$64, DI
	DECQ	CX
	JNZ	loop
	RET

// func fence()
// SFENCE: the weakly ordered non-temporal stores before it are globally
// visible before any store after it.
TEXT ·fence(SB), NOSPLIT, $0-0
	SFENCE
	RET
