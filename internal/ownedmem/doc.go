// Package ownedmem is how package buffer allocates and frees the memory of
// a Buffer made by buffer.Allocate through the resources that keep a record
// of the addresses they hand out as plain pointers (package resource's
// pools), without that record.
//
// A pool resource refuses to free an address it did not hand out: the
// driver's stream-ordered free takes memory of any pool, so a wrong pointer
// would free another pool's memory behind its back. The record that makes
// the refusal possible costs a lock and a map update on each allocation and
// free. A Buffer from buffer.Allocate needs none of it: its address came
// from the resource, and the Buffer frees it exactly once. So the Buffer's
// allocation and free skip the record, and the addresses handed out to
// callers (AllocatePtr, or a Buffer's memory after Disown) are recorded.
//
// Package resource registers its functions from init; package buffer calls
// them. A resource they do not know (ok false) goes through its public
// methods as before.
package ownedmem
