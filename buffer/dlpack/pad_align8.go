//go:build arm || mips || mipsle

package dlpack

// pad64 moves Tensor.ByteOffset to the 8-byte boundary where the ARM EABI
// and MIPS o32 ABIs put a 64-bit field (Go aligns it to 4 here).
const pad64 = 4
