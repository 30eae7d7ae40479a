#include "textflag.h"
#include "go_asm.h"

// trampoline runs on the system stack, entered from runtime.cgocall with
// the C calling convention: R0 holds a *frame. It optionally calls
// frame.ctxfn(frame.ctx) (cuCtxSetCurrent), then frame.fn with frame.args
// (eight in registers, the rest on the stack), and stores R0 in frame.ret.
// The frame is on the calling goroutine's stack, which a Go callback run
// by the C function may move (see frame in call_cgocall.go): the frame is
// found again after the call from its depth below the stack's top.
GLOBL ·trampolineABI0(SB), NOPTR|RODATA, $8
DATA ·trampolineABI0(SB)/8, $trampoline<>(SB)

// Stack use (112 bytes, 16-byte aligned): 0..63 stack arguments 9..16,
// 64 FP/LR, 80 R19, 88 R20, 96 R21, 104 padding. R19..R21 are callee-saved
// in C, so they keep their values across the calls: R19 the frame, R20
// the goroutine's g, R21 the frame's depth below g.stack.hi.
TEXT trampoline<>(SB), NOSPLIT|NOFRAME, $0
	SUB  $112, RSP
	STP  (R29, R30), 64(RSP)
	MOVD R19, 80(RSP)
	MOVD R20, 88(RSP)
	MOVD R21, 96(RSP)
	ADD  $64, RSP, R29
	MOVD R0, R19
	MOVD frame_g(R19), R20
	MOVD const_gStackHi(R20), R21
	SUB  R19, R21, R21 // depth = stack.hi - frame

	MOVD frame_ctxfn(R19), R9
	CBZ  R9, args
	MOVD frame_ctx(R19), R0
	CALL (R9)
	MOVW R0, R0 // CUresult is 32 bits: ignore the upper half
	CBNZ R0, done

args:
	// Arguments 9..16 go on the stack at 0..63(RSP), then 1..8 in R0..R7,
	// two at a time.
	LDP (frame_args+8*8)(R19), (R9, R10)
	STP (R9, R10), 0(RSP)
	LDP (frame_args+10*8)(R19), (R9, R10)
	STP (R9, R10), 16(RSP)
	LDP (frame_args+12*8)(R19), (R9, R10)
	STP (R9, R10), 32(RSP)
	LDP (frame_args+14*8)(R19), (R9, R10)
	STP (R9, R10), 48(RSP)

	LDP  (frame_args+0*8)(R19), (R0, R1)
	LDP  (frame_args+2*8)(R19), (R2, R3)
	LDP  (frame_args+4*8)(R19), (R4, R5)
	LDP  (frame_args+6*8)(R19), (R6, R7)
	MOVD frame_fn(R19), R9
	CALL (R9)

done:
	// The stack may have moved during the call: the frame is at the
	// same depth below the (possibly new) stack.hi.
	MOVD const_gStackHi(R20), R19
	SUB  R21, R19, R19
	MOVD R0, frame_ret(R19)
	MOVD 80(RSP), R19
	MOVD 88(RSP), R20
	MOVD 96(RSP), R21
	LDP  64(RSP), (R29, R30)
	ADD  $112, RSP
	RET

// func getg() uintptr
TEXT ·getg(SB), NOSPLIT, $0-8
	MOVD g, R0
	MOVD R0, ret+0(FP)
	RET
