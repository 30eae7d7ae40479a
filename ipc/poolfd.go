package ipc

import "github.com/cudamem/cudamem/internal/osfd"

// checkPoolFD refuses a descriptor that cannot be a pool the driver
// exported (see osfd.CheckExport), before the driver or a Handle takes it.
func checkPoolFD(op string, fd int) error { return osfd.CheckExport(op, fd, "a pool") }
