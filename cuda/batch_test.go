package cuda

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// CUmemcpyAttributes: an enum (4), two CUmemLocation (8 each, align 4) and
// an unsigned int, worked out by hand with the LP64/LLP64 rules (see
// TestABILayout).
func TestMemcpyAttributesLayout(t *testing.T) {
	var a MemcpyAttributes
	assert.Equal(t, uintptr(24), unsafe.Sizeof(a), "sizeof CUmemcpyAttributes")
	assert.Equal(t, uintptr(4), unsafe.Alignof(a), "alignof CUmemcpyAttributes")
	assert.Equal(t, uintptr(0), unsafe.Offsetof(a.SrcAccessOrder), "srcAccessOrder")
	assert.Equal(t, uintptr(4), unsafe.Offsetof(a.SrcLocHint), "srcLocHint")
	assert.Equal(t, uintptr(12), unsafe.Offsetof(a.DstLocHint), "dstLocHint")
	assert.Equal(t, uintptr(20), unsafe.Offsetof(a.Flags), "flags")
	assert.Equal(t, uintptr(4), unsafe.Sizeof(MemcpySrcAccessOrder(0)), "CUmemcpySrcAccessOrder")
	assert.Equal(t, uintptr(4), unsafe.Sizeof(MemcpyFlags(0)), "CUmemcpyFlags")
	// The batch arrays are passed as CUdeviceptr* and size_t*.
	assert.Equal(t, uintptr(8), unsafe.Sizeof(DevicePtr(0)))
}

func TestMemcpyBatchEnumsMatchHeader(t *testing.T) {
	header := readHeader(t)
	for _, tc := range []struct {
		tag  string
		want map[string]int64
	}{
		{"CUmemcpySrcAccessOrder_enum", map[string]int64{
			"CU_MEMCPY_SRC_ACCESS_ORDER_INVALID":         int64(MemcpySrcAccessOrderInvalid),
			"CU_MEMCPY_SRC_ACCESS_ORDER_STREAM":          int64(MemcpySrcAccessOrderStream),
			"CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL": int64(MemcpySrcAccessOrderDuringAPICall),
			"CU_MEMCPY_SRC_ACCESS_ORDER_ANY":             int64(MemcpySrcAccessOrderAny),
			"CU_MEMCPY_SRC_ACCESS_ORDER_MAX":             0x7fffffff,
		}},
		{"CUmemcpyFlags_enum", map[string]int64{
			"CU_MEMCPY_FLAG_DEFAULT":                     int64(MemcpyFlagDefault),
			"CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE": int64(MemcpyFlagPreferOverlapWithCompute),
		}},
	} {
		got := headerEnum(t, header, tc.tag)
		require.NotEmpty(t, got, tc.tag)
		seen := map[string]bool{}
		for _, c := range got {
			seen[c.name] = true
			v, ok := tc.want[c.name]
			if assert.True(t, ok, "%s = %d has no Go constant", c.name, c.value) {
				assert.Equal(t, v, c.value, c.name)
			}
		}
		for name := range tc.want {
			assert.True(t, seen[name], "%s is not in the header", name)
		}
	}
}

func TestCheckBatchAttrs(t *testing.T) {
	st := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderStream}
	for _, tc := range []struct {
		name  string
		attrs []MemcpyAttributes
		idxs  []uint64
		n     int
		want  string // "" for no error
	}{
		{"nil", nil, nil, 3, ""},
		{"nil, no copies", nil, nil, 0, ""},
		{"one", []MemcpyAttributes{st}, []uint64{0}, 3, ""},
		{"two", []MemcpyAttributes{st, st}, []uint64{0, 2}, 3, ""},
		{"one per copy", []MemcpyAttributes{st, st, st}, []uint64{0, 1, 2}, 3, ""},
		{"lengths", []MemcpyAttributes{st}, nil, 3, "differ in length (1 and 0)"},
		{"empty", []MemcpyAttributes{}, []uint64{}, 3, "empty attrs"},
		{"no copies", []MemcpyAttributes{st}, []uint64{0}, 0, "batch of no copies"},
		{"more than copies", []MemcpyAttributes{st, st}, []uint64{0, 1}, 1, "2 attributes for 1 copies"},
		{"first not 0", []MemcpyAttributes{st}, []uint64{1}, 3, "attrIdxs[0] is 1"},
		{"not increasing", []MemcpyAttributes{st, st}, []uint64{0, 0}, 3, "attrIdxs[1] = 0 does not follow"},
		{"past the end", []MemcpyAttributes{st, st}, []uint64{0, 3}, 3, "attrIdxs[1] = 3 is past the last copy"},
		{"huge index", []MemcpyAttributes{st, st}, []uint64{0, 1 << 63}, 3, "is past the last copy"},
		{"zero order", []MemcpyAttributes{{}}, []uint64{0}, 3, "attrs[0].SrcAccessOrder is 0"},
		{"bad order", []MemcpyAttributes{st, {SrcAccessOrder: 4}}, []uint64{0, 1}, 3, "attrs[1].SrcAccessOrder is 4"},
		{"bad flags", []MemcpyAttributes{{SrcAccessOrder: MemcpySrcAccessOrderAny, Flags: 6}}, []uint64{0}, 3, "attrs[0].Flags 0x6 has unknown bits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBatchAttrs("op", tc.attrs, tc.idxs, tc.n)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "op")
		})
	}
}

func TestPackBatch(t *testing.T) {
	dsts := []DevicePtr{10, 20, 30, 40, 50}
	srcs := []DevicePtr{11, 21, 31, 41, 51}

	// No empty copies: passed as given, with the default attribute.
	sizes := []uint64{1, 2, 3, 4, 5}
	b := packBatch(dsts, srcs, sizes, nil, nil, 5)
	assert.Nil(t, b.index)
	assert.Equal(t, dsts, b.dsts)
	assert.Equal(t, []uintptr{1, 2, 3, 4, 5}, b.sizes)
	assert.Equal(t, []MemcpyAttributes{{SrcAccessOrder: MemcpySrcAccessOrderStream}}, b.attrs)
	assert.Equal(t, []uintptr{0}, b.attrIdxs)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		assert.Same(t, &sizes[0], (*uint64)(unsafe.Pointer(&b.sizes[0])), "no copy on 64-bit targets")
	}

	// Empty copies are left out; attribute indices follow the kept copies,
	// and an attribute whose copies are all empty disappears.
	a := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderStream}
	c := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderAny}
	d := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderDuringAPICall}
	sizes = []uint64{0, 2, 0, 0, 5}
	b = packBatch(dsts, srcs, sizes, []MemcpyAttributes{a, c, d}, []uint64{0, 2, 4}, 2)
	assert.Equal(t, []DevicePtr{20, 50}, b.dsts)
	assert.Equal(t, []DevicePtr{21, 51}, b.srcs)
	assert.Equal(t, []uintptr{2, 5}, b.sizes)
	assert.Equal(t, []int{1, 4}, b.index)
	assert.Equal(t, []MemcpyAttributes{a, d}, b.attrs)
	assert.Equal(t, []uintptr{0, 1}, b.attrIdxs)

	sizes = []uint64{0, 0, 7, 8, 0}
	b = packBatch(dsts, srcs, sizes, []MemcpyAttributes{a, c}, []uint64{0, 3}, 2)
	assert.Equal(t, []int{2, 3}, b.index)
	assert.Equal(t, []MemcpyAttributes{a, c}, b.attrs)
	assert.Equal(t, []uintptr{0, 1}, b.attrIdxs)
}

// A batch goes to the driver in chunks: every copy once, in order, each
// chunk with the attributes in force over it and indices relative to it.
func TestBatchChunks(t *testing.T) {
	a := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderStream}
	c := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderAny}
	d := MemcpyAttributes{SrcAccessOrder: MemcpySrcAccessOrderDuringAPICall}
	b := batch{dsts: make([]DevicePtr, 10), attrs: []MemcpyAttributes{a, c, d}, attrIdxs: []uintptr{0, 4, 5}}
	type call struct {
		lo, hi int
		attrs  []MemcpyAttributes
		idxs   []uintptr
	}
	var got []call
	require.NoError(t, b.chunks(4, func(lo, hi int, attrs []MemcpyAttributes, idxs []uintptr) error {
		got = append(got, call{lo, hi, append([]MemcpyAttributes(nil), attrs...), append([]uintptr(nil), idxs...)})
		return nil
	}))
	assert.Equal(t, []call{
		{0, 4, []MemcpyAttributes{a}, []uintptr{0}},
		{4, 8, []MemcpyAttributes{c, d}, []uintptr{0, 1}},
		{8, 10, []MemcpyAttributes{d}, []uintptr{0}},
	}, got)

	got = nil
	require.NoError(t, b.chunks(3, func(lo, hi int, attrs []MemcpyAttributes, idxs []uintptr) error {
		got = append(got, call{lo, hi, append([]MemcpyAttributes(nil), attrs...), append([]uintptr(nil), idxs...)})
		return nil
	}))
	assert.Equal(t, []call{
		{0, 3, []MemcpyAttributes{a}, []uintptr{0}},
		{3, 6, []MemcpyAttributes{a, c, d}, []uintptr{0, 1, 2}},
		{6, 9, []MemcpyAttributes{d}, []uintptr{0}},
		{9, 10, []MemcpyAttributes{d}, []uintptr{0}},
	}, got)

	// One chunk: the batch's own arrays, untouched. A failure stops it.
	n := 0
	require.NoError(t, b.chunks(batchChunk, func(lo, hi int, attrs []MemcpyAttributes, idxs []uintptr) error {
		n++
		assert.Equal(t, [2]int{0, 10}, [2]int{lo, hi})
		assert.Same(t, &b.attrIdxs[0], &idxs[0])
		return nil
	}))
	assert.Equal(t, 1, n)
	n = 0
	assert.ErrorIs(t, b.chunks(2, func(int, int, []MemcpyAttributes, []uintptr) error { n++; return ErrInvalidArgument }), ErrInvalidArgument)
	assert.Equal(t, 1, n)
	assert.Equal(t, []uintptr{0, 4, 5}, b.attrIdxs, "the batch's indices are left as they were")
}

func TestMemcpyBatchPathString(t *testing.T) {
	assert.Equal(t, "loop of cuMemcpyAsync", MemcpyBatchLoop.String())
	assert.Contains(t, MemcpyBatchV1.String(), "12.8")
	assert.Contains(t, MemcpyBatchV2.String(), "13.0")
	assert.Equal(t, "MemcpyBatchPath(9)", MemcpyBatchPath(9).String())
	assert.Equal(t, MemcpyBatchLoop, (*Device)(nil).MemcpyBatchPath())
	assert.Equal(t, MemcpyBatchLoop, new(Device).MemcpyBatchPath())
}

func TestMemcpyBatchAsyncNilStream(t *testing.T) {
	var s *Stream
	err := s.MemcpyBatchAsync([]DevicePtr{1}, []DevicePtr{2}, []uint64{3}, nil, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	err = new(Stream).MemcpyBatchAsync(nil, nil, nil, nil, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument, "a zero stream is refused even for an empty batch")
	err = s.MemcpyBatchAsync([]DevicePtr{1}, nil, []uint64{3}, nil, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "differ in length (1, 0 and 1)")
	err = s.MemcpyBatchAsync([]DevicePtr{1, ^DevicePtr(0)}, []DevicePtr{2, 2}, []uint64{3, 3}, nil, nil)
	var be *BatchCopyError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 1, be.Index)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "copy 1 of 2")
	err = s.MemcpyBatchAsync([]DevicePtr{1, 0}, []DevicePtr{2, 2}, []uint64{3, 3}, nil, nil)
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 1, be.Index)
	assert.Contains(t, err.Error(), "null address")
}
