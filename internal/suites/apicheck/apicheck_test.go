package apicheck

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the api/*.txt files from the source")

// packages are the public packages, as paths below the module root. Every
// directory holding a non-internal, non-main package must be here; the test
// checks that, so a new package cannot go unpinned.
var packages = []string{
	"buffer",
	"buffer/dlpack",
	"cuda",
	"cuda/checkpoint",
	"ipc",
	"loader",
	"resource",
	"resource/metrics",
	"resource/gpuprof",
	"resource/timeline",
	"virtual",
}

// root is the module root, two levels above this package.
const root = "../../.."

// apiFile names a package's list: api/buffer.txt, api/buffer_dlpack.txt.
func apiFile(pkg string) string {
	return filepath.Join(root, "api", strings.ReplaceAll(pkg, "/", "_")+".txt")
}

func TestAPI(t *testing.T) {
	for _, pkg := range packages {
		got, err := apiLines(pkg)
		if err != nil {
			t.Fatalf("list the API of %s: %v", pkg, err)
		}
		file := apiFile(pkg)
		if *update {
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("read %s: %v (create it: go test ./internal/suites/apicheck -update)", file, err)
			continue
		}
		want := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		if added, removed := diff(want, got); len(added)+len(removed) > 0 {
			var b strings.Builder
			for _, l := range removed {
				fmt.Fprintf(&b, "\n-%s", l)
			}
			for _, l := range added {
				fmt.Fprintf(&b, "\n+%s", l)
			}
			t.Errorf("the API of %s differs from %s:%s\nif the change is intended, update the file: go test ./internal/suites/apicheck -update",
				pkg, file, b.String())
		}
	}
	if *update {
		t.Logf("wrote %d files under %s", len(packages), filepath.Join(root, "api"))
	}
}

// TestAllPackagesPinned fails when a public package is missing from
// packages, or an api file is left over from a package that is gone.
func TestAllPackagesPinned(t *testing.T) {
	listed := map[string]bool{}
	for _, p := range packages {
		listed[p] = true
	}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
			name == "internal" || name == "cmd" || name == "examples" || name == "api" || name == "scripts" || name == "docs") {
			return filepath.SkipDir
		}
		bp, err := linuxAMD64().ImportDir(path, 0)
		if err != nil || bp.Name == "main" || len(bp.GoFiles) == 0 {
			return nil
		}
		if !listed[rel] {
			t.Errorf("public package %s has no api file: add it to packages in %s and run go test ./internal/suites/apicheck -update", rel, "internal/suites/apicheck/apicheck_test.go")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "api", "*.txt"))
	want := map[string]bool{}
	for _, p := range packages {
		want[apiFile(p)] = true
	}
	for _, f := range files {
		if !want[f] {
			t.Errorf("%s belongs to no listed package: remove it", f)
		}
	}
}

// linuxAMD64 is the build context the lists are made in, whatever the host,
// so that build-tagged files give one stable list.
func linuxAMD64() *build.Context {
	c := build.Default
	c.GOOS, c.GOARCH = "linux", "amd64"
	c.CgoEnabled = false
	c.BuildTags = nil
	return &c
}

func diff(want, got []string) (added, removed []string) {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range want {
		w[l] = true
	}
	for _, l := range got {
		g[l] = true
	}
	for _, l := range got {
		if !w[l] {
			added = append(added, l)
		}
	}
	for _, l := range want {
		if !g[l] {
			removed = append(removed, l)
		}
	}
	return added, removed
}

// apiLines lists the exported names of the package in dir pkg, one line
// each, sorted: functions, methods (promoted ones from embedded unexported
// types included), types, exported struct fields, interface methods,
// constants and variables. Types print as the source spells them.
func apiLines(pkg string) ([]string, error) {
	dir := filepath.Join(root, filepath.FromSlash(pkg))
	bp, err := linuxAMD64().ImportDir(dir, 0)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	l := &lister{fset: fset, prefix: "pkg " + pkg + ", ", types: map[string]*ast.TypeSpec{}, methods: map[string][]*ast.FuncDecl{}}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					if d.Name.IsExported() {
						l.add("func %s%s", d.Name.Name, l.sig(d.Type))
					}
					continue
				}
				base, _ := recvBase(d.Recv.List[0].Type)
				l.methods[base] = append(l.methods[base], d)
			case *ast.GenDecl:
				l.genDecl(d)
			}
		}
	}
	for name, ts := range l.types {
		if ast.IsExported(name) {
			l.typeLines(name, ts)
		}
	}
	sort.Strings(l.lines)
	return l.lines, nil
}

type lister struct {
	fset    *token.FileSet
	prefix  string
	lines   []string
	types   map[string]*ast.TypeSpec
	methods map[string][]*ast.FuncDecl // by receiver base type name
}

func (l *lister) add(format string, args ...any) {
	l.lines = append(l.lines, l.prefix+fmt.Sprintf(format, args...))
}

func (l *lister) expr(e ast.Expr) string {
	var b bytes.Buffer
	if err := printer.Fprint(&b, l.fset, e); err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// fields prints a parameter or result list without names, as cmd/api does.
func (l *lister) fields(fl *ast.FieldList) []string {
	var out []string
	if fl == nil {
		return nil
	}
	for _, f := range fl.List {
		n := len(f.Names)
		if n == 0 {
			n = 1
		}
		for range n {
			out = append(out, l.expr(f.Type))
		}
	}
	return out
}

func (l *lister) sig(ft *ast.FuncType) string {
	s := ""
	if ft.TypeParams != nil {
		s = "[" + l.typeParams(ft.TypeParams) + "]"
	}
	s += "(" + strings.Join(l.fields(ft.Params), ", ") + ")"
	res := l.fields(ft.Results)
	switch {
	case len(res) == 1:
		s += " " + res[0]
	case len(res) > 1:
		s += " (" + strings.Join(res, ", ") + ")"
	}
	return s
}

func (l *lister) typeParams(fl *ast.FieldList) string {
	var ps []string
	for _, f := range fl.List {
		var names []string
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		ps = append(ps, strings.Join(names, ", ")+" "+l.expr(f.Type))
	}
	return strings.Join(ps, ", ")
}

func (l *lister) genDecl(d *ast.GenDecl) {
	var typ ast.Expr // carried through a const group, as iota repeats it
	for _, s := range d.Specs {
		switch s := s.(type) {
		case *ast.TypeSpec:
			l.types[s.Name.Name] = s
		case *ast.ValueSpec:
			kind := "var"
			if d.Tok == token.CONST {
				kind = "const"
				if s.Type != nil || len(s.Values) > 0 {
					typ = s.Type
				}
			} else {
				typ = s.Type
			}
			for _, n := range s.Names {
				if !n.IsExported() {
					continue
				}
				if typ != nil {
					l.add("%s %s %s", kind, n.Name, l.expr(typ))
				} else {
					l.add("%s %s", kind, n.Name)
				}
			}
		}
	}
}

func recvBase(e ast.Expr) (name string, ptr bool) {
	if s, ok := e.(*ast.StarExpr); ok {
		e, ptr = s.X, true
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name, ptr
	}
	return "", ptr
}

func (l *lister) typeLines(name string, ts *ast.TypeSpec) {
	tp := ""
	if ts.TypeParams != nil {
		tp = "[" + l.typeParams(ts.TypeParams) + "]"
	}
	switch t := ts.Type.(type) {
	case *ast.StructType:
		if ts.Assign.IsValid() {
			l.add("type %s%s = %s", name, tp, l.expr(t))
			break
		}
		l.add("type %s%s struct", name, tp)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				if en, _ := recvBase(f.Type); ast.IsExported(en) || strings.Contains(l.expr(f.Type), ".") {
					l.add("type %s struct, embedded %s", name, l.expr(f.Type))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					l.add("type %s struct, %s %s", name, n.Name, l.expr(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		if ts.Assign.IsValid() {
			l.add("type %s%s = %s", name, tp, l.expr(t))
			break
		}
		l.add("type %s%s interface", name, tp)
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				l.add("type %s interface, embedded %s", name, l.expr(m.Type))
				continue
			}
			for _, n := range m.Names {
				if n.IsExported() {
					l.add("type %s interface, %s%s", name, n.Name, l.sig(m.Type.(*ast.FuncType)))
				}
			}
		}
	default:
		if ts.Assign.IsValid() {
			l.add("type %s%s = %s", name, tp, l.expr(t))
		} else {
			l.add("type %s%s %s", name, tp, l.expr(t))
		}
	}
	seen := map[string]bool{}
	l.methodLines(name, name, false, seen, 0)
}

// methodLines lists the exported methods of type base as methods of the
// exported type name: its own, then those promoted from embedded types of
// this package that are unexported (an exported embedded type's methods are
// listed under that type, and its embedding line says they are promoted).
func (l *lister) methodLines(name, base string, viaPtr bool, seen map[string]bool, depth int) {
	if depth > 8 {
		return
	}
	for _, m := range l.methods[base] {
		if !m.Name.IsExported() || seen[m.Name.Name] {
			continue
		}
		seen[m.Name.Name] = true
		_, ptr := recvBase(m.Recv.List[0].Type)
		recv := name
		if depth == 0 && ptr {
			recv = "*" + name
		} else if depth > 0 {
			// A promoted method: say where it comes from, so that moving
			// it into an embedded type still reads as the same name.
			recv = name
			if ptr && !viaPtr {
				recv = "*" + name
			}
		}
		l.add("method (%s) %s%s", recv, m.Name.Name, l.sig(m.Type))
	}
	ts := l.types[base]
	if ts == nil {
		return
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return
	}
	for _, f := range st.Fields.List {
		if len(f.Names) != 0 {
			continue
		}
		en, ptr := recvBase(f.Type)
		if en == "" || ast.IsExported(en) {
			continue
		}
		l.methodLines(name, en, viaPtr || ptr, seen, depth+1)
	}
}
