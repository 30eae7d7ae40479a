//go:build linux

package loader_test

import (
	"fmt"
	"log"
	"runtime"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// Any C library works the same way; here the C library's strlen, given a
// pointer to Go memory.
func ExampleProc_Call() {
	libc, err := loader.OpenLibrary("libc.so.6")
	if err != nil {
		log.Fatal(err)
	}
	strlen, err := libc.Lookup("strlen")
	if err != nil {
		log.Fatal(err)
	}
	s := []byte("cudamem\x00")
	n := strlen.Call(uintptr(unsafe.Pointer(&s[0])))
	runtime.KeepAlive(s)
	fmt.Println(n)
	// Output: 7
}
