// Package readme holds tests of the project's documentation: every ```go
// block of README.md and docs/ builds against this checkout (whole
// programs as they are, fragments wrapped in a function with the names an
// HTML comment gives them), and Go code there is marked as Go; the
// programs in examples/ fail cleanly without a driver and
// examples/README.md lists each; the relative links of the README, docs/,
// BENCHMARKS.md and the other pages lead to files and headings that exist;
// no public text names a path outside the repository; the README and
// docs/ name no machines, driver versions, issue numbers or history, and
// neither do the go doc comments of the public packages, which name no
// tests, source files or internal packages either; BENCHMARKS.md is a
// page, not a work log; the README and docs/testing.md name exactly the
// packages whose tests need a C compiler; and the README's Quick start
// holds the test command CI runs. It has no code of its own.
package readme
