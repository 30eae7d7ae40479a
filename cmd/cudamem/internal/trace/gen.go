package trace

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
)

// Kinds are the shapes Generate makes.
var Kinds = []string{"serving", "training", "random"}

// DefaultSteps is each kind's number of steps when Generate is given 0.
var DefaultSteps = map[string]int{"serving": 1500, "training": 20, "random": 20000}

// MaxSteps bounds Generate's steps, so a trace fits in memory.
const MaxSteps = 1_000_000

// Generate returns a trace of the given kind, the same for the same seed
// and steps (0: the kind's DefaultSteps). Every allocation is freed by
// the end.
//
//   - serving: LLM inference. Requests arrive with a prompt of 16-4096
//     tokens and produce 16-1024 tokens; each keeps a KV cache that is
//     reallocated at twice its size when full (the new one allocated
//     before the old is freed); each step allocates activations sized by
//     its tokens and frees them at its end. A step is one decode step.
//   - training: steps of a layered model with activation checkpointing.
//     The forward pass keeps every fourth layer's input and frees the
//     others' at once; the backward pass recomputes each segment, frees
//     its activations as their gradients are made, and keeps one
//     gradient per layer until the step's optimizer update frees them.
//     The batch's tokens vary by step.
//   - random: sizes log-uniform from 256 B to 64 MiB, each living a
//     random number of steps (up to 512 live at once). A step is one
//     allocation.
func Generate(kind string, seed uint64, steps int) ([]Op, error) {
	if steps == 0 {
		steps = DefaultSteps[kind]
	}
	if steps < 0 || steps > MaxSteps {
		return nil, fmt.Errorf("steps %d out of range (want 0 for the default, up to %d)", steps, MaxSteps)
	}
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x6375_6461_6d65_6d21))}
	switch kind {
	case "serving":
		g.serving(steps)
	case "training":
		g.training(steps)
	case "random":
		g.random(steps)
	default:
		return nil, fmt.Errorf("unknown trace kind %q (want serving, training or random)", kind)
	}
	return g.ops, nil
}

type gen struct {
	rng *rand.Rand
	ops []Op
	id  uint64
}

func (g *gen) alloc(size uint64) uint64 {
	g.id++
	g.ops = append(g.ops, Op{ID: g.id, Size: size})
	return g.id
}

func (g *gen) free(id uint64) { g.ops = append(g.ops, Op{Free: true, ID: id}) }

// between returns a number from lo to hi, both included.
func (g *gen) between(lo, hi int) int { return lo + g.rng.IntN(hi-lo+1) }

// The serving shape's model: bytes of KV cache per token, hidden size,
// vocabulary, requests served at once, and the chance per try that a
// request arrives.
const (
	kvPerToken = 32 << 10
	hidden     = 4096
	vocab      = 32000
	maxActive  = 32
	arrival    = 0.35
)

type request struct {
	left      int    // tokens still to produce
	tokens    int    // in the KV cache
	kv        uint64 // the cache's allocation
	capTokens int    // its capacity
}

func (g *gen) serving(steps int) {
	var active []*request
	for range steps {
		fresh := 0
		for len(active) < maxActive && g.rng.Float64() < arrival {
			prompt := g.between(16, 4096)
			c := 1 << bits.Len(uint(prompt-1)) // the power of two that holds the prompt
			active = append(active, &request{left: g.between(16, 1024), tokens: prompt, kv: g.alloc(uint64(c) * kvPerToken), capTokens: c})
			fresh += prompt
		}
		tokens := uint64(fresh + len(active))
		if tokens == 0 {
			continue // no request: the step computes nothing
		}
		var acts []uint64
		for range 3 { // attention inputs and outputs
			acts = append(acts, g.alloc(tokens*hidden*2))
		}
		acts = append(acts, g.alloc(tokens*hidden*7))          // the MLP's intermediate
		acts = append(acts, g.alloc(min(tokens, 256)*vocab*4)) // logits of the sampled positions
		for _, r := range active {
			r.left--
			r.tokens++
			if r.tokens > r.capTokens {
				r.capTokens *= 2
				old := r.kv
				r.kv = g.alloc(uint64(r.capTokens) * kvPerToken)
				g.free(old)
			}
		}
		for _, a := range acts {
			g.free(a)
		}
		active = slices.DeleteFunc(active, func(r *request) bool {
			if r.left <= 0 {
				g.free(r.kv)
				return true
			}
			return false
		})
	}
	for _, r := range active {
		g.free(r.kv)
	}
}

// The training shape's model: layers, hidden size, layers per
// checkpointed segment, and parameters per layer (4h² attention, 8h² MLP).
const (
	layers     = 24
	trainDim   = 2048
	segment    = 4
	paramBytes = 12 * trainDim * trainDim * 2
)

func (g *gen) training(steps int) {
	for range steps {
		tokens := uint64(g.between(2, 8)) * 1024
		act := tokens * trainDim * 2
		// Forward: a segment's first input is kept (the checkpoint); the
		// layers inside it make their temporaries and free them.
		var ckpt []uint64
		for l := range layers {
			if l%segment == 0 {
				ckpt = append(ckpt, g.alloc(act))
			}
			tmp := g.alloc(act * 4) // the MLP's intermediate
			g.free(tmp)
		}
		loss := g.alloc(tokens * 4)
		grads := make([]uint64, 0, layers)
		// Backward, last segment first: recompute its activations from
		// the checkpoint, then walk them back.
		for s := len(ckpt) - 1; s >= 0; s-- {
			var acts []uint64
			for range segment {
				acts = append(acts, g.alloc(act), g.alloc(act*4))
			}
			for i := len(acts) - 1; i >= 0; i -= 2 {
				dx := g.alloc(act) // the gradient of the layer's input
				grads = append(grads, g.alloc(paramBytes))
				g.free(acts[i])
				g.free(acts[i-1])
				g.free(dx)
			}
			g.free(ckpt[s])
		}
		g.free(loss)
		// The optimizer's update, then the gradients go.
		for _, id := range grads {
			g.free(id)
		}
	}
}

const (
	randomMinLog = 8  // 256 B
	randomMaxLog = 26 // 64 MiB
	randomLive   = 512
)

func (g *gen) random(steps int) {
	type entry struct {
		id  uint64
		end int
	}
	var live []entry
	for step := range steps {
		exp := randomMinLog + g.rng.Float64()*(randomMaxLog-randomMinLog)
		size := uint64(math.Exp2(exp))
		live = append(live, entry{g.alloc(size), step + 1 + g.rng.IntN(2*randomLive)})
		if len(live) > randomLive { // one goes early, at random
			i := g.rng.IntN(len(live))
			live[i].end = step
		}
		live = slices.DeleteFunc(live, func(e entry) bool {
			if e.end <= step {
				g.free(e.id)
				return true
			}
			return false
		})
	}
	g.rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for _, e := range live {
		g.free(e.id)
	}
}
