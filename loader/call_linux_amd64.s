#include "textflag.h"
#include "go_asm.h"

// trampoline runs on the system stack, entered from runtime.cgocall with
// the C calling convention: DI holds a *frame. It optionally calls
// frame.ctxfn(frame.ctx) (cuCtxSetCurrent), then frame.fn with frame.args
// (six in registers, the rest on the stack), and stores RAX in frame.ret.
// The frame is on the calling goroutine's stack, which a Go callback run
// by the C function may move (see frame in call_cgocall.go): the frame is
// found again after the call from its depth below the stack's top.
GLOBL ·trampolineABI0(SB), NOPTR|RODATA, $8
DATA ·trampolineABI0(SB)/8, $trampoline<>(SB)

// Stack use: BP, BX, R12 and R13 saved (32 bytes), then 88 bytes: stack
// arguments 7..16 at 0..79 and 8 bytes of padding. Entry SP is 8 mod 16
// (the caller's CALL pushed a return address onto a 16-byte aligned
// stack); four pushes make it 8 mod 16 again, and 88 more bytes make it
// 0 mod 16 at each CALL, as the System V ABI requires (SSE code in libc
// faults otherwise). BX, R12 and R13 are callee-saved in C, so they keep
// their values across the calls: BX the frame, R12 the goroutine's g,
// R13 the frame's depth below g.stack.hi.
TEXT trampoline<>(SB), NOSPLIT|NOFRAME, $0
	PUSHQ BP
	MOVQ  SP, BP
	PUSHQ BX
	PUSHQ R12
	PUSHQ R13
	SUBQ  $88, SP
	MOVQ  DI, BX
	MOVQ  frame_g(BX), R12
	MOVQ  const_gStackHi(R12), R13
	SUBQ  BX, R13 // depth = stack.hi - frame

	MOVQ frame_ctxfn(BX), AX
	TESTQ AX, AX
	JZ   args
	MOVQ frame_ctx(BX), DI
	CALL AX
	MOVLQSX AX, AX
	TESTQ AX, AX
	JNZ  done

args:
	// Arguments 7..16 go on the stack at 0(SP)..72(SP), unrolled: a loop
	// costs a few cycles a call on the hot path. call_linux_arm64.s does
	// the same job for its ABI (eight register arguments, loads in pairs);
	// the two instruction sets share no code.
	MOVQ (frame_args+6*8)(BX), AX
	MOVQ AX, 0(SP)
	MOVQ (frame_args+7*8)(BX), AX
	MOVQ AX, 8(SP)
	MOVQ (frame_args+8*8)(BX), AX
	MOVQ AX, 16(SP)
	MOVQ (frame_args+9*8)(BX), AX
	MOVQ AX, 24(SP)
	MOVQ (frame_args+10*8)(BX), AX
	MOVQ AX, 32(SP)
	MOVQ (frame_args+11*8)(BX), AX
	MOVQ AX, 40(SP)
	MOVQ (frame_args+12*8)(BX), AX
	MOVQ AX, 48(SP)
	MOVQ (frame_args+13*8)(BX), AX
	MOVQ AX, 56(SP)
	MOVQ (frame_args+14*8)(BX), AX
	MOVQ AX, 64(SP)
	MOVQ (frame_args+15*8)(BX), AX
	MOVQ AX, 72(SP)

	MOVQ (frame_args+0*8)(BX), DI
	MOVQ (frame_args+1*8)(BX), SI
	MOVQ (frame_args+2*8)(BX), DX
	MOVQ (frame_args+3*8)(BX), CX
	MOVQ (frame_args+4*8)(BX), R8
	MOVQ (frame_args+5*8)(BX), R9
	MOVQ frame_fn(BX), R10
	XORL AX, AX // no vector registers used, for variadic callees
	CALL R10

done:
	// The stack may have moved during the call: the frame is at the
	// same depth below the (possibly new) stack.hi.
	MOVQ const_gStackHi(R12), BX
	SUBQ R13, BX
	MOVQ AX, frame_ret(BX)
	ADDQ $88, SP
	POPQ R13
	POPQ R12
	POPQ BX
	POPQ BP
	RET

// func getg() uintptr
TEXT ·getg(SB), NOSPLIT, $0-8
	MOVQ (TLS), AX
	MOVQ AX, ret+0(FP)
	RET
