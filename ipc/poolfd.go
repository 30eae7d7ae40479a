package ipc

import "github.com/cudamem/cudamem/internal/osfd"

// checkPoolFD refuses a descriptor that cannot be a pool the driver
// exported, before the driver or a Handle takes it: a pipe, FIFO, socket,
// regular file, directory, symbolic link or block device (see
// osfd.CheckExport, which package virtual's Import shares). Without POSIX
// descriptors it checks nothing (no Handle can be made there).
func checkPoolFD(op string, fd int) error { return osfd.CheckExport(op, fd, "a pool") }
