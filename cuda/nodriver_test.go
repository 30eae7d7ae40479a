package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cudamem/cudamem/loader"
)

// The load failure says "no CUDA driver" once, still matches ErrNoDriver
// and unwraps to the loader's error.
func TestNoDriverErrorSaysItOnce(t *testing.T) {
	le := &loader.LoadError{Attempts: []loader.Attempt{{Path: "libcuda.so.1", Err: errors.New("dlopen: libcuda.so.1: gone")}}}
	err := error(&noDriverError{le})
	assert.Equal(t, "cuda: no CUDA driver: libcuda.so.1: gone (set CUDAMEM_DRIVER to the driver library's path to choose it)", err.Error())
	assert.ErrorIs(t, err, ErrNoDriver)
	var got *loader.LoadError
	assert.ErrorAs(t, err, &got)
	assert.Same(t, le, got)

	// Anything else the loader might return is still introduced once.
	err = &noDriverError{errors.New("something odd")}
	assert.Equal(t, "cuda: no CUDA driver: something odd", err.Error())

	// And the real load, on a machine without a driver.
	if _, _, err := Driver(); errors.Is(err, ErrNoDriver) {
		assert.Equal(t, 1, strings.Count(err.Error(), "no CUDA driver"), err.Error())
		assert.NotContains(t, err.Error(), "\n")
	}
}
