#include "textflag.h"
#include "go_asm.h"

// trampoline runs on the system stack, entered from runtime.cgocall with
// the C calling convention: R0 holds a *frame. It optionally calls
// frame.ctxfn(frame.ctx) (cuCtxSetCurrent), then frame.fn with frame.args
// (eight in registers, the rest on the stack), and stores R0 in frame.ret.
GLOBL ·trampolineABI0(SB), NOPTR|RODATA, $8
DATA ·trampolineABI0(SB)/8, $trampoline<>(SB)

// Stack use (96 bytes, 16-byte aligned): 0..63 stack arguments 9..16,
// 64 FP/LR, 80 R19 (callee-saved; keeps the frame across calls).
TEXT trampoline<>(SB), NOSPLIT|NOFRAME, $0
	SUB  $96, RSP
	STP  (R29, R30), 64(RSP)
	MOVD R19, 80(RSP)
	ADD  $64, RSP, R29
	MOVD R0, R19

	MOVD frame_ctxfn(R19), R9
	CBZ  R9, args
	MOVD frame_ctx(R19), R0
	CALL (R9)
	MOVW R0, R0 // CUresult is 32 bits: ignore the upper half
	CBNZ R0, done

args:
	MOVD (frame_args+8*8)(R19), R9
	MOVD R9, 0(RSP)
	MOVD (frame_args+9*8)(R19), R9
	MOVD R9, 8(RSP)
	MOVD (frame_args+10*8)(R19), R9
	MOVD R9, 16(RSP)
	MOVD (frame_args+11*8)(R19), R9
	MOVD R9, 24(RSP)
	MOVD (frame_args+12*8)(R19), R9
	MOVD R9, 32(RSP)
	MOVD (frame_args+13*8)(R19), R9
	MOVD R9, 40(RSP)
	MOVD (frame_args+14*8)(R19), R9
	MOVD R9, 48(RSP)
	MOVD (frame_args+15*8)(R19), R9
	MOVD R9, 56(RSP)

	MOVD (frame_args+0*8)(R19), R0
	MOVD (frame_args+1*8)(R19), R1
	MOVD (frame_args+2*8)(R19), R2
	MOVD (frame_args+3*8)(R19), R3
	MOVD (frame_args+4*8)(R19), R4
	MOVD (frame_args+5*8)(R19), R5
	MOVD (frame_args+6*8)(R19), R6
	MOVD (frame_args+7*8)(R19), R7
	MOVD frame_fn(R19), R9
	CALL (R9)

done:
	MOVD R0, frame_ret(R19)
	MOVD 80(RSP), R19
	LDP  64(RSP), (R29, R30)
	ADD  $96, RSP
	RET
