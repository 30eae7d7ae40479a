//go:build linux

package probe

import (
	"testing"

	"github.com/cudamem/cudamem/internal/fakecuda"
)

var fake *fakecuda.Driver

func TestMain(m *testing.M) { fakecuda.Main(m, "probe", &fake) }
