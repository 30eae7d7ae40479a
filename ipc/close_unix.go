//go:build unix

package ipc

import "syscall"

func closeFD(fd int) error { return syscall.Close(fd) }
