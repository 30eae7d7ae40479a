//go:build !unix

package ipc

// checkPoolFD has nothing to check without POSIX descriptors (no Handle
// can be made there).
func checkPoolFD(string, int) error { return nil }
