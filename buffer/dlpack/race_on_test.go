//go:build race

package dlpack_test

const raceBuild = true
