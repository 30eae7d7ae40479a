package buffer

// Hooks for the external tests and benchmarks.

// SetStaging forces staging of large host copies on or off; the returned
// function restores the default.
func SetStaging(on bool) (restore func()) {
	old := stagingOff.Swap(!on)
	return func() { stagingOff.Store(old) }
}

// ResetStaging frees the staging pool and sets its parameters for the
// next allocation.
func ResetStaging(chunkSize, chunks, workers int) error {
	return resetStaging(chunkSize, chunks, workers)
}

// StagingConfig returns the staging pool's parameters.
func StagingConfig() (chunkSize, chunks, workers int) {
	return stageChunkSize, stageChunks, stageWorkers
}

// StageMinBytes is the smallest copy staged both ways by default.
const StageMinBytes = max(defaultStageMinBytes, defaultStageOutMinBytes)

// StageInMinBytes is the threshold of copies into a device alone.
const StageInMinBytes = defaultStageMinBytes

// StagedCopies counts the host copies that went through the staging pool.
func StagedCopies() int64 { return stage.staged.Load() }
