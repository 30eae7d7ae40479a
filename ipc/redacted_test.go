package ipc

import (
	"encoding/hex"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// formatVerbs are the verbs tried on every key-holding value: the brief
// ones and those that print numbers (which fmt applies field by field to
// a struct without a Formatter).
var formatVerbs = []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "% x", "%q", "%d", "%o", "%b", "%c", "%U", "%08x"}

// keyForms lists ways the key's bytes could appear in formatted text: the
// raw bytes, hex in both cases, and each verb's rendering of every
// 4-byte window of the key (decimal, octal, 0x-prefixed, ...), with the
// brackets fmt puts around a slice taken off.
func keyForms(k poolKey) []string {
	kb := []byte(*k.k)
	forms := []string{string(kb), hex.EncodeToString(kb), strings.ToUpper(hex.EncodeToString(kb))}
	for i := 0; i+4 <= len(kb); i++ {
		w := kb[i : i+4]
		forms = append(forms, string(w), hex.EncodeToString(w), strings.ToUpper(hex.EncodeToString(w)))
		for _, v := range append(formatVerbs, "%#x", "%#o") {
			s := fmt.Sprintf(v, w)
			s = strings.TrimPrefix(s, "[]byte")
			s = strings.Trim(s, "[]{}\"")
			if len(s) >= 7 { // short renderings (%c, say) match by chance
				forms = append(forms, s)
			}
		}
		var dec, comma []string
		for _, b := range w {
			dec = append(dec, fmt.Sprint(b))
			comma = append(comma, fmt.Sprintf("%#x", b))
		}
		forms = append(forms, strings.Join(dec, " "), strings.Join(dec, ", "), strings.Join(comma, ", "))
	}
	return forms
}

// assertNoKey formats v with every verb and fails if any form of k
// appears in the output.
func assertNoKey(t *testing.T, name string, v any, k poolKey) {
	t.Helper()
	forms := keyForms(k)
	for _, verb := range formatVerbs {
		out := fmt.Sprintf(verb, v)
		for _, f := range forms {
			if strings.Contains(out, f) {
				t.Errorf("%s formatted with %s shows the key (as %q): %s", name, verb, f, out)
				break
			}
		}
	}
}

// TestSecretsFormatRedacted: no fmt verb prints a pool key, whether the
// value holding it is a Handle, a FabricHandle, an ImportedPool or the
// key itself, a pointer or a value, alone or inside another value. Before,
// %v of a *Handle printed the 32 key bytes in decimal and %#v of a
// FabricHandle in hex.
func TestSecretsFormatRedacted(t *testing.T) {
	k := newPoolKey()
	// The fabric handle is a secret too (it lets the domain's processes
	// import the pool): its bytes are checked like a key's.
	var fabricData [64]byte
	copy(fabricData[:], []byte(*newPoolKey().k))
	copy(fabricData[32:], []byte(*newPoolKey().k))
	fk := keyFrom(fabricData[16:48])

	var h *Handle
	if runtime.GOOS != "windows" {
		var err error
		h, err = NewHandle(pipeReadEnd(t), cuda.NewUUID().String())
		require.NoError(t, err)
		h.key = k
		defer h.Close()
	} else {
		h = &Handle{uuid: cuda.NewUUID(), key: k}
	}
	fh := &FabricHandle{uuid: cuda.NewUUID(), key: k, h: sealFabric(cuda.MemFabricHandle{Data: fabricData})}
	p, _ := fakePool(t)
	p.key = k
	defer p.Close()
	st := &exportState{uuid: cuda.NewUUID(), key: k}

	values := map[string]any{
		"*Handle":               h,
		"Handle":                *h,
		"*FabricHandle":         fh,
		"FabricHandle":          *fh,
		"*ImportedPool":         p,
		"poolKey":               k,
		"*exportState":          st,
		"struct{H *Handle}":     struct{ H *Handle }{h},
		"struct{H Handle}":      struct{ H Handle }{*h},
		"struct{h Handle}":      struct{ h Handle }{*h},
		"struct{f FabricHandl}": struct{ f FabricHandle }{*fh},
		"struct{k poolKey}":     struct{ k poolKey }{k},
		"[]any":                 []any{h, *h, fh, *fh, p, k},
		"map":                   map[string]*Handle{"h": h},
	}
	for name, v := range values {
		assertNoKey(t, name, v, k)
		assertNoKey(t, name, v, fk)
	}
	// The check itself finds a key that is printed.
	leaky := fmt.Sprintf("%v", []byte(*k.k))
	assert.Contains(t, leaky, keyForms(k)[len(keyForms(k))-3], "the forms match fmt's own rendering")

	// Redacted, not empty: the output still says what the value is.
	assert.Contains(t, fmt.Sprint(h), h.UUID().String())
	assert.Contains(t, fmt.Sprint(h), keyRedacted)
	assert.Contains(t, fmt.Sprintf("%#v", h), "ipc.Handle{")
	assert.Contains(t, fmt.Sprintf("%#v", fh), "ipc.FabricHandle{")
	assert.Contains(t, fmt.Sprintf("%q", fh), `"FabricHandle(pool `)
	assert.Contains(t, fmt.Sprint(p), p.UUID().String())
	assert.Equal(t, "none", fmt.Sprint(poolKey{}))
	var nilH *Handle
	assert.Equal(t, "<nil>", fmt.Sprint(nilH))
	assert.Equal(t, "ipc.Handle(zero)", fmt.Sprint(&Handle{}))
	require.NoError(t, h.Close())
	assertNoKey(t, "closed *Handle", h, k)
}
