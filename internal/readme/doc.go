// Package readme holds tests of the project's documentation: every ```go
// block of README.md is a complete program that builds against this
// checkout; the programs in examples/ fail cleanly without a driver and
// examples/README.md lists each; the relative links of the README, docs/,
// CHANGELOG.md, SECURITY.md and examples/README.md lead to files and
// headings that exist; no public text names a path outside the
// repository; the README and docs/ name no machines, driver versions or
// issue numbers; and the README's Quick start holds the test command CI
// runs. It has no code of its own.
package readme
