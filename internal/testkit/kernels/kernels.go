package kernels

import _ "embed"

//go:embed kernels.ptx
var ptx string

// Kernel names in the module, as passed to cuModuleGetFunction.
const (
	PatternWrite = "cudamem_pattern_write" // (u64 ptr, u64 n, u32 seed): byte i = Pattern byte i
	PatternCheck = "cudamem_pattern_check" // (u64 ptr, u64 n, u32 seed, u64 counter): counts differing bytes
	AddU32       = "cudamem_add_u32"       // (u64 ptr, u64 words, u32 v): ptr[i] += v
	FillU32      = "cudamem_fill_u32"      // (u64 ptr, u64 words, u32 v): ptr[i] = v
)

// PTX returns a fresh copy of the module's PTX text (without a trailing
// NUL; cuda.Device.LoadModule adds one).
func PTX() []byte { return []byte(ptx) }

// Pattern returns the bytes the pattern kernels write: byte i is
// byte(uint32(i)*31 + seed).
func Pattern(n int, seed uint32) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint32(i)*31 + seed)
	}
	return b
}
