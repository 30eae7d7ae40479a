package readme

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// history matches what belongs in commit messages, the change log and
// the benchmark log, not in documentation a user reads: machine names,
// driver versions, issue numbers, leases, sessions, dates, and what was
// once seen happening.
var history = regexp.MustCompile(`\b(A100|H100|H200|B200|GB200)\b|\bdriver (version )?\d{3}\b|\b[Ii]ssues? #?\d+|(^|[\s(])#\d+\b|\b[Ll]eases?\b|\bthis session\b|\bthe morning\b|\bw(as|ere) seen\b|\(seen[:,] |\b20\d\d-\d\d-\d\d\b|\b\d+-core\b`)

// implementation matches what a package's API documentation must not
// send its reader to: test names, source file names and internal
// packages, none of which go doc shows.
var implementation = regexp.MustCompile(`\b(Test|Benchmark|Fuzz)[A-Z]\w*|\b\w+\.go\b|\binternal/\w+`)

// publicPackages lists the directories of the module's packages a user
// reads with go doc: every package outside internal/, testdata/ and
// examples/ (whose programs document themselves in examples/README.md).
func publicPackages(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || rel == "internal" || rel == "examples" || rel == "api" || rel == "scripts" || rel == "docs") {
			return filepath.SkipDir
		}
		files, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				dirs = append(dirs, rel)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// docComment is one doc comment of a package: where it is and its text.
type docComment struct {
	where string
	text  string
}

// packageDocs returns the package comments and the doc comments of the
// exported declarations (types, their exported fields and methods,
// functions, constants, variables) of the package in dir, from every
// non-test file whatever its build constraints. For a command (package
// main) only the package comment counts: that is what go doc shows.
func packageDocs(t *testing.T, root, dir string) []docComment {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []docComment
	add := func(g *ast.CommentGroup) {
		if g == nil {
			return
		}
		pos := fset.Position(g.Pos())
		rel, _ := filepath.Rel(root, pos.Filename)
		out = append(out, docComment{where: filepath.ToSlash(rel) + ":" + strconv.Itoa(pos.Line), text: g.Text()})
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		add(f.Doc)
		if f.Name.Name == "main" {
			continue
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
					add(d.Doc)
				}
			case *ast.GenDecl:
				exported := false
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						exported = true
						add(s.Doc)
						add(s.Comment)
						fieldDocs(s.Type, add)
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								exported = true
								add(s.Doc)
								add(s.Comment)
								break
							}
						}
					}
				}
				if exported {
					add(d.Doc)
				}
			}
		}
	}
	return out
}

// fieldDocs adds the doc comments of a struct's exported fields and an
// interface's exported methods.
func fieldDocs(typ ast.Expr, add func(*ast.CommentGroup)) {
	var list *ast.FieldList
	switch x := typ.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return
	}
	for _, f := range list.List {
		for _, n := range f.Names {
			if n.IsExported() {
				add(f.Doc)
				add(f.Comment)
				break
			}
		}
	}
}

func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	typ := recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

// proseLines drops a doc comment's code blocks (lines indented by a tab):
// an example may name a file, as a program's stack does.
func proseLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "\t") {
			out = append(out, l)
		}
	}
	return out
}

// The documentation go doc shows for every public package (its package
// comment and the comments of its exported names) is free of history
// (machines, leases, driver versions, issue numbers, dates, what was
// once seen) and sends no reader to tests, source files or internal
// packages.
func TestGoDocsNameNoHistory(t *testing.T) {
	root := repoRoot(t)
	dirs := publicPackages(t, root)
	for _, want := range []string{"cuda", "buffer", "buffer/dlpack", "resource", "resource/gpuprof", "resource/metrics", "resource/timeline", "ipc", "virtual", "loader", "cmd/cudamem"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("public packages %v lack %s: is the walk broken?", dirs, want)
		}
	}
	checked := 0
	for _, dir := range dirs {
		for _, c := range packageDocs(t, root, dir) {
			checked++
			for _, l := range proseLines(c.text) {
				for _, re := range []*regexp.Regexp{history, implementation} {
					if m := re.FindString(l); m != "" {
						t.Errorf("%s: %q in %q (go doc shows no history, tests, files or internal packages)", c.where, strings.TrimSpace(m), strings.TrimSpace(l))
					}
				}
			}
		}
	}
	if checked < 500 {
		t.Errorf("only %d doc comments checked: is the parse broken?", checked)
	}
	t.Logf("%d doc comments of %d packages checked", checked, len(dirs))
}
