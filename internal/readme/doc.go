// Package readme holds tests of the project's documentation: every ```go
// block of README.md is a complete program that builds against this
// checkout, and the programs in examples/ fail cleanly without a driver.
// It has no code of its own.
package readme
