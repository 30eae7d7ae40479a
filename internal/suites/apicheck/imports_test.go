package apicheck

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// modulePath is the module's import path, the prefix of its internal
// packages.
const modulePath = "github.com/cudamem/cudamem"

// internalImports lists, for each public package, the internal packages its
// non-test code may import in a normal build. Anything else is a
// dependency a reader of the public package cannot see: the driver's
// entry-point table lives in package cuda, and the loader reaches the
// fault-injection hook only in builds with the cudamemfault tag
// (faultImports).
var internalImports = map[string][]string{
	"buffer":            {"asleep", "staging", "warn"},
	"cuda":              {"asleep", "warn"},
	"ipc":               {"osfd", "poolcore"},
	"resource":          {"frames", "poolcore"},
	"resource/gpuprof":  {"frames"},
	"resource/timeline": {"frames"},
	"virtual":           {"asleep", "osfd"},
}

// faultImports are the internal packages a public package may import in
// addition with -tags cudamemfault.
var faultImports = map[string][]string{
	"loader": {"faultinject"},
}

func TestPublicPackagesImportInternalOnlyAsListed(t *testing.T) {
	for _, tags := range [][]string{nil, {"cudamemfault"}} {
		ctx := linuxAMD64()
		ctx.BuildTags = tags
		for _, pkg := range packages {
			bp, err := ctx.ImportDir(filepath.Join(root, filepath.FromSlash(pkg)), 0)
			if err != nil {
				t.Fatalf("%s (tags %v): %v", pkg, tags, err)
			}
			allowed := internalImports[pkg]
			if len(tags) > 0 {
				allowed = append(slices.Clone(allowed), faultImports[pkg]...)
			}
			for _, imp := range bp.Imports {
				rest, ok := strings.CutPrefix(imp, modulePath+"/internal/")
				if ok && !slices.Contains(allowed, rest) {
					t.Errorf("package %s imports %s in a build with tags %v; its non-test code may import only %v from internal/ (see internalImports in %s)",
						pkg, imp, tags, allowed, "internal/suites/apicheck/imports_test.go")
				}
			}
		}
	}
}
