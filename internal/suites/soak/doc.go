// Package soak holds no code: its test, TestSoak, is the GPU soak test.
// Hundreds of goroutines allocate from every kind of memory
// resource on every GPU (two when present), hand the buffers to other
// goroutines that verify them on the device and on the host, copy them
// (host to device, device to host, device to device, peer), fill and slice
// them, and free them on a stream other than the one that allocated them.
// Every error fails the test, and at the end every pool, adaptor and the
// buffer leak counter must be back at their baseline, and the devices'
// free memory close to where it started.
//
// It runs for CUDAMEM_SOAK (a Go duration; 3s by default, 60s on the GPU
// machine) and skips without a GPU.
package soak
