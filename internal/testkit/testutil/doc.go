// Package testutil holds helpers that tests of several cudamem packages
// share, so that each is written once: listing this process's open file
// descriptors, finding descriptors a test left open, and a memory resource
// of made-up addresses for tests and examples without a GPU. It is
// internal: test helpers are not part of cudamem's API.
package testutil
