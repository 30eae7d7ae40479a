//go:build !unix

package osfd

// CheckExport has nothing to check without POSIX descriptors: no export
// is a file descriptor there (New reports cuda.ErrNotSupported), so the
// caller's own steps refuse the descriptor.
func CheckExport(op string, fd int, what string) error { return nil }
