// Package metrics exports cudamem's memory counters in the forms
// monitoring already reads: an [expvar.Var] (JSON under /debug/vars) and
// an [net/http.Handler] serving the Prometheus text exposition format,
// version 0.0.4. It uses the standard library only; no client library is
// needed to be scraped. The package example serves a device pool's
// counters both ways.
//
// A [Registry] holds named sources, read afresh at every scrape:
//
//   - [Registry.AddStatistics]: a resource.Statistics adaptor's counters
//     (current, peak and total bytes and allocations, failures);
//   - [Registry.AddPool]: a pool's attributes as the driver reports them
//     (reserved and used bytes with their high watermarks, release
//     threshold): resource.DevicePool, resource.PinnedPool or anything
//     with an Attributes method (an imported IPC pool);
//   - [Registry.AddSubAllocator]: a resource.SubAllocator's books
//     (reserved, used and free bytes, blocks, live allocations, free
//     ranges: fragmentation shows as free ranges over blocks).
//
// Serve it from a program:
//
//	reg := new(metrics.Registry)
//	reg.AddStatistics("model", stats)
//	reg.AddPool("gpu0", pool)
//	http.Handle("/metrics", reg)     // Prometheus
//	expvar.Publish("cudamem", reg)   // /debug/vars
//
// # Prometheus names
//
// Every sample has the label resource="NAME" (the name given to Add) and
// device="N" (the source's DeviceID; -1 for host memory).
//
//	cudamem_live_bytes                   gauge    Statistics CurrentBytes
//	cudamem_live_bytes_peak              gauge    Statistics PeakBytes
//	cudamem_live_allocations             gauge    Statistics CurrentCount
//	cudamem_live_allocations_peak        gauge    Statistics PeakCount
//	cudamem_allocated_bytes_total        counter  Statistics TotalBytes
//	cudamem_allocations_total            counter  Statistics TotalCount
//	cudamem_allocation_failures_total    counter  Statistics Failures
//	cudamem_pool_reserved_bytes          gauge    ReservedMemCurrent
//	cudamem_pool_reserved_bytes_high     gauge    ReservedMemHigh
//	cudamem_pool_used_bytes              gauge    UsedMemCurrent
//	cudamem_pool_used_bytes_high         gauge    UsedMemHigh
//	cudamem_pool_release_threshold_bytes gauge    ReleaseThreshold
//	cudamem_suballocator_reserved_bytes  gauge    SubAllocatorStats Reserved
//	cudamem_suballocator_used_bytes      gauge    Used
//	cudamem_suballocator_free_bytes      gauge    Free
//	cudamem_suballocator_blocks          gauge    Blocks
//	cudamem_suballocator_allocations     gauge    Allocations
//	cudamem_suballocator_free_ranges     gauge    FreeRanges
//	cudamem_source_up                    gauge    1, or 0 when the source could not be read
//
// Every family name is unique under the classic text format and under
// OpenMetrics, where a counter's family is its name without _total: the
// gauges of what is live are cudamem_live_*, the counters of everything
// ever allocated cudamem_allocated_bytes_total and
// cudamem_allocations_total.
//
// A pool that cannot be read (closed, or the driver failed) reports
// cudamem_source_up 0 and no other samples; the expvar JSON says why
// under "errors". Values are integers; Prometheus reads them as floats,
// exact below 2^53.
package metrics
