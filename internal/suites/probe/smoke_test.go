//go:build linux

package probe

import (
	"github.com/cudamem/cudamem/buffer"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func TestSmoke(t *testing.T) {
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := resource.Default(d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := buffer.Allocate(mr, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(b, fake.Snapshot())
	b.Close()
}
