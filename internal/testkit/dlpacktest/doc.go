// Package dlpacktest builds and drives a small C library (testdata/
// dlpacktest.c, embedded) that stands in for a DLPack consumer and
// producer in tests of package buffer/dlpack: it reads tensors' fields as
// C sees them, writes and sums their bytes, calls deleters (on its own
// threads too), and makes tensors whose deleter counts its calls. Like
// package fakecuda, it needs a C compiler at test time only.
package dlpacktest
