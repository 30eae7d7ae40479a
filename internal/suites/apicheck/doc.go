// Package apicheck pins cudamem's public surface. Its test lists every
// exported name of every public package, with its signature, and compares
// the list with the files under api/ at the module root, so that a change
// to the API is a visible change to a checked-in file rather than a side
// effect found by users. After an intended change, regenerate the files:
//
//	go test ./internal/suites/apicheck -update
package apicheck
