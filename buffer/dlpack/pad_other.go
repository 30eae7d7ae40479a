//go:build !(arm || mips || mipsle)

package dlpack

// pad64 is 0: Go's alignment of 64-bit fields matches the C ABI here (8
// bytes on 64-bit targets, 4 on 386 as in the i386 System V ABI).
const pad64 = 0
