//go:build !linux

package ipc

import "github.com/cudamem/cudamem/cuda"

// torchRefFile is a counter file of torch's: shared-memory files of Linux,
// where alone CUDA's legacy IPC runs.
type torchRefFile struct{}

func openTorchRefFile(op, name string, index uint64) (torchRefFile, torchRefKey, error) {
	return torchRefFile{}, torchRefKey{}, cuda.Errorf(op, cuda.ErrNotSupported, "torch's reference counters (%s) are shared-memory files of Linux", name)
}

func (torchRefFile) releaseCounter(string, uint64) error {
	return cuda.Errorf("ipc.torchRef", cuda.ErrNotSupported, "torch's reference counters are shared-memory files of Linux")
}

func (torchRefFile) close() error { return nil }
