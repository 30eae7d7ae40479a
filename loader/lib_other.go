//go:build !windows && !(linux && (amd64 || arm64))

package loader

import "runtime"

var defaultPaths []string

var noDriverReason = "CUDA drivers do not exist for " + runtime.GOOS + "/" + runtime.GOARCH

// Library is never opened on this system.
type Library struct{}

// OpenLibrary always fails here: there is no CUDA driver for this system.
func OpenLibrary(path string) (*Library, error) { return nil, &LoadError{Reason: noDriverReason} }

// Path is empty.
func (l *Library) Path() string { return "" }

// Lookup always fails.
func (l *Library) Lookup(name string) (Proc, error) { return Proc{name: name}, errNoSymbol }

// Close does nothing.
func (l *Library) Close() error { return nil }

// Call returns NotFound: nothing can be resolved here.
func (p *Proc) Call(args ...uintptr) uintptr { return NotFound }

// CallCtx returns NotFound: nothing can be resolved here.
func (p *Proc) CallCtx(ctx uintptr, args ...uintptr) uintptr { return NotFound }
