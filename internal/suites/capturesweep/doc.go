// Package capturesweep is the capture sweep: every public operation that
// takes or touches a stream, run while that stream captures, while another
// stream of the same context captures, while the stream it waits on (or
// frees on) captures, and on the legacy default stream while a blocking
// stream captures. Each must be refused with an error matching
// cuda.ErrCapturing, or succeed as work that is captured correctly (or runs
// outside the capture); either way the capture must still end cleanly, and
// nothing may leak. It holds only tests: on a CPU they run on the fake
// driver (internal/testkit/fakecuda), and on the real one where
// CUDAMEM_REQUIRE_GPU=1 (see TestMain).
package capturesweep
