package staging

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrefaultNames(t *testing.T) {
	for _, p := range []Prefault{PrefaultOff, PrefaultTouch, PrefaultPopulate} {
		got, err := ParsePrefault(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := ParsePrefault("sometimes")
	assert.ErrorContains(t, err, `unknown prefault mode "sometimes"`)
	assert.Equal(t, "Prefault(7)", Prefault(7).String())
}

func TestParamsCheck(t *testing.T) {
	good := Params{MinBytes: 4 << 20, OutMinBytes: 16 << 20, FreshMinBytes: 256 << 10, ChunkSize: 8 << 20, Chunks: 4, InWorkers: 8, OutWorkers: 8, Prefault: PrefaultPopulate, Eager: true}
	require.NoError(t, good.Check())
	assert.Equal(t, "min=4MiB/16MiB/256KiB chunks=4x8MiB in=8 out=8 prefault=populate eager=true", good.String())
	for _, bad := range []func(*Params){
		func(p *Params) { p.MinBytes = -1 },
		func(p *Params) { p.OutMinBytes = -1 },
		func(p *Params) { p.FreshMinBytes = -1 },
		func(p *Params) { p.ChunkSize = 100 << 10 },
		func(p *Params) { p.ChunkSize = 1<<30 + 64<<10 },
		func(p *Params) { p.Chunks = 65 },
		func(p *Params) { p.OutWorkers = 0 },
		func(p *Params) { p.InWorkers = 257 },
		func(p *Params) { p.Prefault = -1 },
		func(p *Params) { p.Ahead = -1 },
		func(p *Params) { p.FreshWorkers = -1 },
		func(p *Params) { p.FreshWorkers = 257 },
		func(p *Params) { p.Ahead = 2; p.Prefault = PrefaultTouch },
	} {
		p := good
		bad(&p)
		assert.Error(t, p.Check(), "%v", p)
	}
}

func TestStatsSub(t *testing.T) {
	a := Stats{Copies: 5, Bytes: 50, WaitNs: 7, MoveNs: 9, PrefaultNs: 11, IdleNs: 13, Workers: 15}
	b := Stats{Copies: 2, Bytes: 20, WaitNs: 1, MoveNs: 2, PrefaultNs: 3, IdleNs: 4, Workers: 5}
	assert.Equal(t, Stats{3, 30, 6, 7, 8, 9, 10}, a.Sub(b))
}
