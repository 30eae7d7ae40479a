package ipc_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// A pool shared across nodes of an NVLink domain: its FabricHandle is
// plain bytes (with the pool's key: send them only to trusted peers, over
// a private channel), and buffers travel as Descriptors as for fd pools.
func ExampleExportPoolFabric() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{Fabric: true})
	if errors.Is(err, cuda.ErrNotSupported) {
		fmt.Println("no fabric handles here:", err) // names IMEX
		return
	} else if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	h, err := ipc.ExportPoolFabric(pool)
	if err != nil {
		log.Fatal(err)
	}
	msg, err := h.MarshalBinary() // ipc.FabricHandleSize bytes: send them
	if err != nil {
		log.Fatal(err)
	}
	// On the other node:
	var got ipc.FabricHandle
	if err := got.UnmarshalBinary(msg); err != nil {
		log.Fatal(err)
	}
	imp, err := ipc.ImportPoolFabric(dev, &got)
	if err != nil {
		log.Fatal(err)
	}
	defer imp.Close()
	// then imp.Import(descriptor, stream) for each buffer, as for ImportPool.
}

// Fabric handles arriving from elsewhere are checked when decoded.
func ExampleFabricHandle_UnmarshalBinary() {
	var h ipc.FabricHandle
	err := h.UnmarshalBinary(make([]byte, ipc.FabricHandleSize))
	fmt.Println(errors.Is(err, ipc.ErrBadFabricHandle))
	// Output:
	// true
}
