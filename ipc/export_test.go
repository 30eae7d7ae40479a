package ipc

// SealWithHandleKey seals d with the pool key h carries, as the pool's
// exporter does: the GPU tests use it to make descriptors that lie (an
// oversized Size) yet carry a valid MAC, the case of a peer that holds the
// key, so that the importer's bounds checks stay tested on the real
// driver. It panics on a Handle without a key (a test mistake).
func SealWithHandleKey(h *Handle, d Descriptor) Descriptor {
	if !h.HasKey() {
		panic("ipc.SealWithHandleKey: the handle has no pool key")
	}
	return h.key.seal(d)
}
