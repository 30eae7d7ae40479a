package ipc

import (
	"testing"

	"github.com/cudamem/cudamem/resource"
)

// TestPoolStateOnPool: a pool's export state (UUID and key) is made once
// and kept on the pool, so every export of one pool carries the same UUID
// and two pools never share one.
func TestPoolStateOnPool(t *testing.T) {
	a, b := new(resource.DevicePool), new(resource.PinnedPool)
	sa, err := poolState("test", a)
	if err != nil {
		t.Fatal(err)
	}
	again, err := poolState("test", a)
	if err != nil {
		t.Fatal(err)
	}
	if again != sa {
		t.Errorf("a pool's state was made twice")
	}
	sb, err := poolState("test", b)
	if err != nil {
		t.Fatal(err)
	}
	if sb.uuid == sa.uuid || sb.key == sa.key {
		t.Errorf("two pools share a UUID or key")
	}
	if _, err := poolState("test", &ImportedPool{}); err == nil {
		t.Errorf("an imported pool has no export state of its own, but poolState made one")
	}
}
