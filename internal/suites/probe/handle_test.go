//go:build linux

package probe

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
)

func TestHandleHostile(t *testing.T) {
	before := len(testutil.FDs(t))
	for _, fd := range []int{-1, -100, 1 << 30, 999999} {
		noPanic(t, "NewHandle", func() {
			h, err := ipc.NewHandle(fd, cuda.NewUUID().String())
			if err == nil {
				t.Errorf("NewHandle(%d): accepted", fd)
				h.Close()
			} else {
				wantErr(t, "NewHandle", err, "ipc.NewHandle")
			}
		})
	}
	for _, tok := range []string{"", "x", strings.Repeat("A", 1<<16), "cudamem-pool:" + strings.Repeat("0", 200)} {
		noPanic(t, "token", func() {
			fd := devNull(t)
			h, err := ipc.NewHandle(fd, tok)
			if err == nil {
				t.Errorf("NewHandle(%.20q): accepted", tok)
				h.Close()
			} else {
				syscall.Close(fd) // refused: still the caller's
			}
		})
	}
	h, err := ipc.NewHandle(devNull(t), cuda.NewUUID().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Error(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := h.FD(); err == nil {
		t.Errorf("FD after Close: no error")
	} else {
		wantErr(t, "fd", err, "")
	}
	if _, err := h.ExtraFile(); err == nil {
		t.Errorf("ExtraFile after Close: no error")
	}
	if _, err := ipc.ExportPool(nil); err == nil {
		t.Errorf("ExportPool(nil): no error")
	}
	if _, err := ipc.ImportPool(dev(t, 0), h); err == nil {
		t.Errorf("ImportPool(closed handle): no error")
	} else {
		wantErr(t, "import closed", err, "ipc.ImportPool")
	}
	if _, err := ipc.OpenLegacy(dev(t, 0), ipc.LegacyHandle{Size: 1 << 63}); err == nil {
		t.Errorf("OpenLegacy(garbage): no error")
	} else {
		wantErr(t, "legacy", err, "ipc.OpenLegacy")
	}
	if got := len(testutil.FDs(t)); got != before {
		t.Errorf("fds %d, before %d", got, before)
	}
}

func devNull(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return fd
}
