package readme

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// needCC sorts the packages whose tests `go test ./...` runs (this
// platform's view, no build tags) by what they need a C compiler for:
// whole, those whose TestMain runs every test against the fake driver
// (fakecuda.Main skips the package without a compiler); some, the others
// whose tests build the fake driver or a C library (they import
// internal/testkit/fakecuda or internal/testkit/dlpacktest, or read CUDAMEM_REQUIRE_CC)
// and skip those tests alone.
func needCC(t *testing.T, root string) (whole, some []string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		pkg, err := build.Default.ImportDir(path, 0)
		if err != nil {
			return nil // no Go package here (or none for this platform)
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		all, any := false, false
		fset := token.NewFileSet()
		for _, name := range append(slices.Clone(pkg.TestGoFiles), pkg.XTestGoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(path, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if p == module+"/internal/testkit/fakecuda" || p == module+"/internal/testkit/dlpacktest" {
					any = true
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if id, ok := x.X.(*ast.Ident); ok && id.Name == "fakecuda" && x.Sel.Name == "Main" {
						all = true
					}
				case *ast.CallExpr: // os.Getenv("CUDAMEM_REQUIRE_CC")
					sel, ok := x.Fun.(*ast.SelectorExpr)
					if !ok || sel.Sel.Name != "Getenv" || len(x.Args) != 1 {
						break
					}
					if lit, ok := x.Args[0].(*ast.BasicLit); ok && lit.Value == `"CUDAMEM_REQUIRE_CC"` {
						any = true
					}
				}
				return true
			})
		}
		switch {
		case all:
			whole = append(whole, rel)
		case any:
			some = append(some, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return whole, some
}

var (
	allTestsOf  = regexp.MustCompile(`all the tests of ((?:[^.]|\.[^\s])*?) skip`)
	someTestsOf = regexp.MustCompile(`some tests of ((?:[^.]|\.[^\s])*?) skip`)
	codeSpan    = regexp.MustCompile("`([^`]+)`")
)

// namedPackages returns the packages a page's sentence names after
// "all the tests of" and after "some tests of", in code spans.
func namedPackages(text string) (whole, some []string, ok bool) {
	text = strings.Join(strings.Fields(text), " ")
	a, b := allTestsOf.FindStringSubmatch(text), someTestsOf.FindStringSubmatch(text)
	if a == nil || b == nil {
		return nil, nil, false
	}
	for _, m := range codeSpan.FindAllStringSubmatch(a[1], -1) {
		whole = append(whole, m[1])
	}
	for _, m := range codeSpan.FindAllStringSubmatch(b[1], -1) {
		some = append(some, m[1])
	}
	return whole, some, true
}

func TestNamedPackages(t *testing.T) {
	whole, some, ok := namedPackages("so they need one. Without one, all the tests of `a/b`, `c` and\n`d` skip, and some tests of `e.f` and `g` skip, each saying why.")
	if !ok || !slices.Equal(whole, []string{"a/b", "c", "d"}) || !slices.Equal(some, []string{"e.f", "g"}) {
		t.Errorf("namedPackages = %q, %q, %v", whole, some, ok)
	}
	if _, _, ok := namedPackages("no such sentence"); ok {
		t.Error("a page without the sentence passes")
	}
}

// The README and docs/testing.md say which packages' tests need a C
// compiler, and they name exactly the packages whose tests do.
func TestCCPackagesNamed(t *testing.T) {
	root := repoRoot(t)
	whole, some := needCC(t, root)
	if len(whole) == 0 || len(some) == 0 {
		t.Fatalf("found %q needing a C compiler for all their tests and %q for some: is the scan broken?", whole, some)
	}
	for _, file := range []string{"README.md", "docs/testing.md"} {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		w, s, ok := namedPackages(string(md))
		if !ok {
			t.Errorf("%s does not say which packages need a C compiler (\"all the tests of `...` skip, and some tests of `...` skip\")", file)
			continue
		}
		if !slices.Equal(w, whole) {
			t.Errorf("%s names %q as skipping all their tests without a C compiler; their TestMain says %q", file, w, whole)
		}
		if !slices.Equal(s, some) {
			t.Errorf("%s names %q as skipping some tests without a C compiler; their tests say %q", file, s, some)
		}
	}
}
