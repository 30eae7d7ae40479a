package readme

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A ```go block of README.md or docs/*.md is one of two things, and the
// test builds both against this checkout:
//
//   - a whole file, starting with "package": built as it is;
//
//   - a fragment: statements, or declarations, built in a file of their
//     own with the imports they use. Names a fragment uses without
//     declaring them are given on the line before the block, as a Go
//     parameter list in an HTML comment, which Markdown does not show:
//
//     <!-- given: dev *cuda.Device, s *cuda.Stream -->
//
//     Statements become the body of a function returning error; the
//     variables they declare at their top level may go unused, as in the
//     rest of a program they would not.
//
// Both must be gofmt-clean (a fragment as the body of a function).
type snippet struct {
	file  string // the page, relative to the repository
	line  int    // the line of the opening fence
	given string // the parameter list of the given names, or ""
	src   string
}

var givenComment = regexp.MustCompile(`^<!-- given: (.*) -->$`)

// snippets returns the ```go blocks of a Markdown page, with the names
// the line before each gives it.
func snippets(file string, md []byte) (out []snippet, err error) {
	var (
		cur     *snippet
		body    strings.Builder
		prev    string
		inFence bool
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			cur.src = body.String()
			out = append(out, *cur)
			cur, inFence = nil, false
			body.Reset()
		case cur != nil:
			body.WriteString(line + "\n")
		case inFence && strings.HasPrefix(line, "```"):
			inFence = false
		case inFence:
		case line == "```go":
			cur = &snippet{file: file, line: n}
			if m := givenComment.FindStringSubmatch(prev); m != nil {
				cur.given = m[1]
			}
		case strings.HasPrefix(line, "```"):
			inFence = true
		case strings.HasPrefix(line, "<!-- given:") && !givenComment.MatchString(line):
			return nil, fmt.Errorf("%s:%d: malformed %q (want <!-- given: PARAMS -->)", file, n, line)
		}
		if strings.TrimSpace(line) != "" || cur != nil {
			prev = line
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```go block that never ends", file, cur.line)
	}
	return out, nil
}

func TestSnippetsExtracted(t *testing.T) {
	md := "text\n<!-- given: dev *cuda.Device -->\n```go\nx := 1\n```\n```\nnot go\n```\n  ```go\nindented: not a block of the page\n  ```\n```go\npackage main\n```\n```sh\n```go\n```\n"
	got, err := snippets("p.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	want := []snippet{{"p.md", 3, "dev *cuda.Device", "x := 1\n"}, {"p.md", 12, "", "package main\n"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("snippets = %q, want %q", got, want)
	}
	if _, err := snippets("p.md", []byte("<!-- given dev -->\n<!-- given: x\n")); err == nil {
		t.Error("a malformed given comment is accepted")
	}
	if _, err := snippets("p.md", []byte("```go\nx := 1\n")); err == nil {
		t.Error("an unterminated block is accepted")
	}
}

// importPaths are the packages fragments may use without importing
// them, by the name they are used under.
var importPaths = map[string]string{
	"cuda":       module + "/cuda",
	"buffer":     module + "/buffer",
	"dlpack":     module + "/buffer/dlpack",
	"resource":   module + "/resource",
	"gpuprof":    module + "/resource/gpuprof",
	"metrics":    module + "/resource/metrics",
	"timeline":   module + "/resource/timeline",
	"ipc":        module + "/ipc",
	"virtual":    module + "/virtual",
	"loader":     module + "/loader",
	"checkpoint": module + "/cuda/checkpoint",
	"bufio":      "bufio",
	"bytes":      "bytes",
	"context":    "context",
	"errors":     "errors",
	"expvar":     "expvar",
	"fmt":        "fmt",
	"hex":        "encoding/hex",
	"http":       "net/http",
	"io":         "io",
	"json":       "encoding/json",
	"log":        "log",
	"net":        "net",
	"os":         "os",
	"exec":       "os/exec",
	"runtime":    "runtime",
	"slog":       "log/slog",
	"strconv":    "strconv",
	"strings":    "strings",
	"sync":       "sync",
	"syscall":    "syscall",
	"time":       "time",
	"unsafe":     "unsafe",
}

// isDecls reports whether src parses as a file's top-level declarations.
func isDecls(src string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", "package p\n\n"+src, parser.SkipObjectResolution)
	return err == nil
}

func indent(src string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(src, "\n") {
		if strings.TrimSpace(l) != "" {
			b.WriteString("\t")
		}
		b.WriteString(l)
	}
	return b.String()
}

// wrapped is the shape gofmt checks a fragment in: a function body or
// top-level declarations, with no imports.
func wrapped(s snippet) string {
	if isDecls(s.src) {
		return "package p\n\n" + s.src
	}
	return "package p\n\nfunc snippet() error {\n" + indent(s.src) + "}\n"
}

// unwrapped undoes wrapped on gofmt's output: the block as gofmt would
// have it.
func unwrapped(s snippet, src string) string {
	if strings.HasPrefix(s.src, "package ") {
		return src
	}
	src = strings.TrimPrefix(src, "package p\n\n")
	if isDecls(s.src) {
		return src
	}
	src = strings.TrimSuffix(strings.TrimPrefix(src, "func snippet() error {\n"), "}\n")
	var b strings.Builder
	for _, l := range strings.SplitAfter(src, "\n") {
		b.WriteString(strings.TrimPrefix(l, "\t"))
	}
	return b.String()
}

// program turns a snippet into a Go file that builds as a package of
// its own (name), with //line directives that make the compiler's
// errors name the page and line.
func program(s snippet, name string) (string, error) {
	if strings.HasPrefix(s.src, "package ") {
		return fmt.Sprintf("//line %s:%d\n%s", s.file, s.line+1, s.src), nil
	}
	var given string
	if s.given != "" {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "", "package p\n\nfunc _("+s.given+") {}\n", parser.SkipObjectResolution)
		if err != nil {
			return "", fmt.Errorf("the given names %q do not parse as parameters: %v", s.given, err)
		}
		var b strings.Builder
		b.WriteString("var (\n")
		for _, fld := range f.Decls[0].(*ast.FuncDecl).Type.Params.List {
			var names []string
			for _, n := range fld.Names {
				names = append(names, n.Name)
			}
			typ := s.given[fset.Position(fld.Type.Pos()).Offset-len("package p\n\nfunc _(") : fset.Position(fld.Type.End()).Offset-len("package p\n\nfunc _(")]
			fmt.Fprintf(&b, "\t%s %s\n", strings.Join(names, ", "), typ)
		}
		b.WriteString(")\n\n")
		given = b.String()
	}
	var body string
	if isDecls(s.src) {
		body = fmt.Sprintf("//line %s:%d\n%s", s.file, s.line+1, s.src)
	} else {
		f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n\nfunc snippet() error {\n"+s.src+"\n}\n", parser.SkipObjectResolution)
		if err != nil {
			return "", fmt.Errorf("neither declarations nor statements: %v", err)
		}
		stmts := f.Decls[0].(*ast.FuncDecl).Body.List
		var declared []string
		for _, st := range stmts {
			switch x := st.(type) {
			case *ast.AssignStmt:
				if x.Tok == token.DEFINE {
					for _, l := range x.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
							declared = append(declared, id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := x.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, sp := range g.Specs {
						for _, id := range sp.(*ast.ValueSpec).Names {
							if id.Name != "_" {
								declared = append(declared, id.Name)
							}
						}
					}
				}
			}
		}
		sort.Strings(declared)
		declared = slices.Compact(declared)
		var tail strings.Builder
		for _, d := range declared {
			fmt.Fprintf(&tail, "\t_ = %s\n", d)
		}
		tail.WriteString("\treturn nil\n") // unreachable after a return of the block's own: the compiler does not mind
		body = fmt.Sprintf("func snippet() error {\n//line %s:%d\n%s\n%s}\n", s.file, s.line+1, s.src, tail.String())
	}
	// The imports are the known packages the file names but does not
	// declare.
	noImports := "package " + name + "\n\n" + given + body
	f, err := parser.ParseFile(token.NewFileSet(), "", noImports, 0)
	if err != nil {
		return "", err
	}
	var imports []string
	for _, id := range f.Unresolved {
		if p, ok := importPaths[id.Name]; ok && !slices.Contains(imports, p) {
			imports = append(imports, p)
		}
	}
	sort.Strings(imports)
	var b strings.Builder
	b.WriteString("package " + name + "\n\n")
	for _, p := range imports {
		fmt.Fprintf(&b, "import %q\n", p)
	}
	b.WriteString("\n" + given + body)
	return b.String(), nil
}

func TestProgramOfFragment(t *testing.T) {
	got, err := program(snippet{file: "d.md", line: 7, given: "dev *cuda.Device, n uint64", src: "s, err := dev.NewStream()\nif err != nil {\n\treturn fmt.Errorf(\"stream: %w\", err)\n}\n"}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"import \"fmt\"\nimport \"" + module + "/cuda\"\n",
		"var (\n\tdev *cuda.Device\n\tn uint64\n)\n",
		"func snippet() error {\n//line d.md:8\ns, err := dev.NewStream()\n",
		"\t_ = err\n\t_ = s\n\treturn nil\n}\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("program lacks %q:\n%s", want, got)
		}
	}
	got, err = program(snippet{file: "d.md", line: 1, src: "type T struct{ b *buffer.Buffer }\n"}, "p2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "import \""+module+"/buffer\"\n\n//line d.md:2\ntype T struct") {
		t.Errorf("declarations wrapped as\n%s", got)
	}
}

// snippetPages are the pages whose ```go blocks must build.
func snippetPages(t *testing.T, root string) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		rel, _ := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// goLooking matches lines of Go in a block not marked as Go.
var goLooking = regexp.MustCompile(`:= |\berr != nil\b|^func |\bdefer \w`)

// Go code in the README and docs/ is marked ```go, so that it is built:
// a fence without a language holds commands or output, not Go.
func TestGoCodeIsMarked(t *testing.T) {
	root := repoRoot(t)
	for _, file := range snippetPages(t, root) {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		fence, start := "", 0
		sc := bufio.NewScanner(bytes.NewReader(md))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case fence == "" && strings.HasPrefix(line, "```"):
				fence, start = line, n
			case fence != "" && line == "```":
				fence = ""
			case fence == "```" && goLooking.MatchString(line):
				t.Errorf("%s:%d: the block has Go in it (%q): mark it ```go so that it is built", file, start, strings.TrimSpace(line))
				fence = "checked"
			}
		}
	}
}

// Every ```go block of the README and docs/ builds (CGO_ENABLED=0)
// against this checkout, in a module of its own as a user's would be,
// and is gofmt-clean; the README's blocks are whole programs.
func TestGoSnippetsBuild(t *testing.T) {
	root := repoRoot(t)
	var all []snippet
	for _, file := range snippetPages(t, root) {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		s, err := snippets(file, md)
		if err != nil {
			t.Fatal(err)
		}
		if file == "README.md" {
			if len(s) == 0 {
				t.Error("README.md has no ```go blocks")
			}
			for _, b := range s {
				if !strings.HasPrefix(b.src, "package main\n") || !strings.Contains(b.src, "\nfunc main() {") {
					t.Errorf("README.md:%d: the ```go block is not a whole program (package main with func main)", b.line)
				}
			}
		}
		all = append(all, s...)
	}
	gotool := goTool(t)
	dir := t.TempDir()
	for i, s := range all {
		where := fmt.Sprintf("%s:%d", s.file, s.line)
		shape := s.src
		if !strings.HasPrefix(s.src, "package ") {
			shape = wrapped(s)
		}
		if fmtd, err := format.Source([]byte(shape)); err != nil {
			t.Errorf("%s: the ```go block does not parse: %v\n%s", where, err, s.src)
			continue
		} else if string(fmtd) != shape {
			t.Errorf("%s: the ```go block is not gofmt-formatted; gofmt makes it:\n%s", where, unwrapped(s, string(fmtd)))
		}
		name := fmt.Sprintf("snippet%d", i+1)
		src, err := program(s, name)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		write(t, filepath.Join(dir, name, "main.go"), src)
	}
	if t.Failed() {
		return
	}
	write(t, filepath.Join(dir, "go.mod"), fmt.Sprintf("module snippets.example\n\ngo 1.24\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", module, module, filepath.ToSlash(root)))
	// The replaced module's requirements resolve from the module cache
	// (GOPROXY=off): their checksums are the checkout's own go.sum.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	// Several packages: go build compiles them all and writes nothing.
	// (With -o DIR it would build only the main packages.)
	cmd := exec.Command(gotool, "build", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOSUMDB=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the ```go blocks do not build (%v):\n%s", err, out)
	}
	t.Logf("built %d ```go blocks of %d pages", len(all), len(snippetPages(t, root)))
}
