package checkpoint_test

import (
	"errors"
	"fmt"
	"log"
	"os/exec"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/checkpoint"
)

// Suspend a CUDA program: lock it, move its GPU memory to host memory
// (the GPU is then free for others), and later put it back and let it run.
func ExampleProcess() {
	cmd := exec.Command("./my-cuda-program")
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	p := checkpoint.Process{PID: cmd.Process.Pid}

	err := p.Lock(10 * time.Second)
	if errors.Is(err, cuda.ErrNotSupported) {
		fmt.Println("no checkpoints here:", err) // says what is missing
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Checkpoint(); err != nil {
		log.Fatal(err)
	}
	state, err := p.State()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(state) // checkpointed

	// ... the GPU is free here ...

	if err := p.Restore(nil); err != nil {
		log.Fatal(err)
	}
	if err := p.Unlock(); err != nil {
		log.Fatal(err)
	}
}

// Restore a process onto another GPU of the same chip: every GPU it was
// checkpointed on is mapped, here the first two swapped.
func ExampleProcess_Restore() {
	ds, err := cuda.Devices()
	if err != nil || len(ds) < 2 {
		return
	}
	gpus := map[cuda.UUID]cuda.UUID{}
	var uuids []cuda.UUID
	for _, d := range ds {
		u, err := d.UUID()
		if err != nil {
			log.Fatal(err)
		}
		uuids = append(uuids, u)
		gpus[u] = u
	}
	gpus[uuids[0]], gpus[uuids[1]] = uuids[1], uuids[0]

	p := checkpoint.Process{PID: 1234} // locked and checkpointed before
	if err := p.Restore(&checkpoint.RestoreOptions{GPUs: gpus}); err != nil {
		log.Fatal(err)
	}
}
