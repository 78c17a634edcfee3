#include "textflag.h"

// func streamLinesSSE2(dst, src *byte, n uintptr)
// dst 64-byte aligned, n a positive multiple of 64. Unaligned loads (MOVOU),
// non-temporal stores (MOVNTO = MOVNTDQ). No fence: see fence.
TEXT ·streamLinesSSE2(SB), NOSPLIT, $0-24
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

// func streamLinesAVX2(dst, src *byte, n uintptr)
// As streamLinesSSE2 with 32-byte loads and non-temporal stores (VMOVNTDQ),
// two lines per iteration and a last single line when n/64 is odd.
TEXT ·streamLinesAVX2(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	MOVQ	CX, DX
	SHRQ	$7, CX
	JZ	tail
loop2:
	VMOVDQU	0(SI), Y0
	VMOVDQU	32(SI), Y1
	VMOVDQU	64(SI), Y2
	VMOVDQU	96(SI), Y3
	VMOVNTDQ	Y0, 0(DI)
	VMOVNTDQ	Y1, 32(DI)
	VMOVNTDQ	Y2, 64(DI)
	VMOVNTDQ	Y3, 96(DI)
	ADDQ	$128, SI
	ADDQ	$128, DI
	DECQ	CX
	JNZ	loop2
tail:
	TESTQ	$64, DX
	JZ	done
	VMOVDQU	0(SI), Y0
	VMOVDQU	32(SI), Y1
	VMOVNTDQ	Y0, 0(DI)
	VMOVNTDQ	Y1, 32(DI)
done:
	VZEROUPPER
	RET

// func streamPairAVX2(dstA, srcA, dstB, srcB *byte, n uintptr)
// Copies n bytes (a positive multiple of 64) from srcA to dstA and from srcB
// to dstB, one line of each per iteration, with non-temporal stores; dstA
// and dstB 64-byte aligned. No fence.
TEXT ·streamPairAVX2(SB), NOSPLIT, $0-40
	MOVQ	dstA+0(FP), DI
	MOVQ	srcA+8(FP), SI
	MOVQ	dstB+16(FP), R8
	MOVQ	srcB+24(FP), R9
	MOVQ	n+32(FP), CX
	SHRQ	$6, CX
pairloop:
	VMOVDQU	0(SI), Y0
	VMOVDQU	32(SI), Y1
	VMOVDQU	0(R9), Y2
	VMOVDQU	32(R9), Y3
	VMOVNTDQ	Y0, 0(DI)
	VMOVNTDQ	Y1, 32(DI)
	VMOVNTDQ	Y2, 0(R8)
	VMOVNTDQ	Y3, 32(R8)
	ADDQ	$64, SI
	ADDQ	$64, DI
	ADDQ	$64, R9
	ADDQ	$64, R8
	DECQ	CX
	JNZ	pairloop
	VZEROUPPER
	RET

// func fence()
// SFENCE: the weakly ordered non-temporal stores before it are globally
// visible before any store after it.
TEXT ·fence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func interleave32AVX2(dst, a, b *byte, lines uintptr)
// Writes lines 64-byte lines of dst, line i the 32 bytes at a+32i then the
// 32 bytes at b+32i, with non-temporal stores; dst 32-byte aligned. Two
// lines an iteration, then the odd one. No fence.
TEXT ·interleave32AVX2(SB), NOSPLIT, $0-32
	MOVQ	dst+0(FP), DI
	MOVQ	a+8(FP), SI
	MOVQ	b+16(FP), DX
	MOVQ	lines+24(FP), CX
	MOVQ	CX, R8
	SHRQ	$1, CX
	JZ	ilast
iloop:
	VMOVDQU	0(SI), Y0
	VMOVDQU	0(DX), Y1
	VMOVDQU	32(SI), Y2
	VMOVDQU	32(DX), Y3
	VMOVNTDQ	Y0, 0(DI)
	VMOVNTDQ	Y1, 32(DI)
	VMOVNTDQ	Y2, 64(DI)
	VMOVNTDQ	Y3, 96(DI)
	ADDQ	$64, SI
	ADDQ	$64, DX
	ADDQ	$128, DI
	DECQ	CX
	JNZ	iloop
ilast:
	TESTQ	$1, R8
	JZ	idone
	VMOVDQU	0(SI), Y0
	VMOVDQU	0(DX), Y1
	VMOVNTDQ	Y0, 0(DI)
	VMOVNTDQ	Y1, 32(DI)
idone:
	VZEROUPPER
	RET

// func interleave32SSE2(dst, a, b *byte, lines uintptr)
// interleave32AVX2 with 16-byte moves; dst 16-byte aligned.
TEXT ·interleave32SSE2(SB), NOSPLIT, $0-32
	MOVQ	dst+0(FP), DI
	MOVQ	a+8(FP), SI
	MOVQ	b+16(FP), DX
	MOVQ	lines+24(FP), CX
sloop:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	0(DX), X2
	MOVOU	16(DX), X3
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	ADDQ	$32, SI
	ADDQ	$32, DX
	ADDQ	$64, DI
	DECQ	CX
	JNZ	sloop
	RET
