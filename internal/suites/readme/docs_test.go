package readme

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// userDocs are the Markdown pages a user reads from the README: the
// README, docs/, the change log, the security policy and the examples'
// list.
func userDocs(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md", "SECURITY.md", "examples/README.md"}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docs/ has no pages")
	}
	for _, p := range pages {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// outsideFences returns the lines of a Markdown file outside fenced code
// blocks, with their line numbers.
func outsideFences(md []byte) (lines []string, numbers []int) {
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines = append(lines, line)
			numbers = append(numbers, n)
		}
	}
	return lines, numbers
}

// prose is outsideFences with inline code spans blanked out.
func prose(md []byte) (lines []string, numbers []int) {
	lines, numbers = outsideFences(md)
	for i, l := range lines {
		lines[i] = inlineCode.ReplaceAllString(l, "``")
	}
	return lines, numbers
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*$`)
)

// anchor is the fragment GitHub gives a heading: lower case, punctuation
// dropped (but - and _), spaces as hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"Quick start":                  "quick-start",
		"Across nodes: fabric handles": "across-nodes-fabric-handles",
		"Lifetimes: handles, host calls, asynchronous work": "lifetimes-handles-host-calls-asynchronous-work",
		"The `cudamem` command":                             "the-cudamem-command",
	} {
		if got := anchor(in); got != want {
			t.Errorf("anchor(%q) = %q, want %q", in, got, want)
		}
	}
}

// anchors lists the heading anchors of a Markdown file.
func anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	lines, _ := outsideFences(md)
	for _, l := range lines {
		if m := mdHeading.FindStringSubmatch(l); m != nil {
			out[anchor(strings.ReplaceAll(m[1], "`", ""))] = true
		}
	}
	return out
}

// Every relative link of the user's pages leads to a file or folder of
// the repository, and every #fragment to a heading of its page. Links
// to the web are not followed.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, file := range append(userDocs(t, root), "BENCHMARKS.md", "testdata/README.md", "testdata/figures/README.md", "testdata/figures/HISTORY.md") {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Error(err)
			continue
		}
		lines, numbers := prose(md)
		for i, line := range lines {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				where := file + ":" + strconv.Itoa(numbers[i]) + ": " + target
				path, frag, _ := strings.Cut(target, "#")
				dest := filepath.Join(root, file)
				if path != "" {
					dest = filepath.Join(filepath.Dir(dest), filepath.FromSlash(path))
				}
				rel, err := filepath.Rel(root, dest)
				if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
					t.Errorf("%s: leads outside the repository", where)
					continue
				}
				st, err := os.Stat(dest)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				if frag == "" {
					continue
				}
				if st.IsDir() || filepath.Ext(dest) != ".md" {
					t.Errorf("%s: a #fragment of something that is not a Markdown page", where)
					continue
				}
				page, err := os.ReadFile(dest)
				if err != nil {
					t.Error(err)
					continue
				}
				if !anchors(page)[frag] {
					t.Errorf("%s: %s has no heading #%s", where, rel, frag)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d links checked: is the link pattern broken?", checked)
	}
	t.Logf("%d links checked", checked)
}

// outside matches the paths of the developers' own tree beside the
// repository (../shared/tools/gpu-pack and the like).
var outside = regexp.MustCompile(`(^|[^.])\.\./shared/\S*|\bshared/tools/\S*`)

// Public text names no path outside the repository: someone who cloned it
// has no ../shared. (The packing script lives in scripts/.)
func TestNoPathsOutsideRepository(t *testing.T) {
	root := repoRoot(t)
	files := userDocs(t, root)
	files = append(files, "BENCHMARKS.md", "testdata/README.md", "testdata/cgobench/main.go", "scripts/gpu-pack")
	cmds, err := filepath.Glob(filepath.Join(root, "cmd", "cudamem", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if !strings.HasSuffix(c, "_test.go") {
			rel, _ := filepath.Rel(root, c)
			files = append(files, filepath.ToSlash(rel))
		}
	}
	for _, file := range files {
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Error(err)
			continue
		}
		for _, loc := range outside.FindAllIndex(text, -1) {
			line := 1 + bytes.Count(text[:loc[0]], []byte("\n"))
			t.Errorf("%s:%d names %q, a path outside the repository", file, line, text[loc[0]:loc[1]])
		}
	}
}

// The README and docs/ are library documentation: no machine names,
// driver versions, issue numbers, leases, dates or what was once seen
// (those belong in tests, BENCHMARKS.md, testdata/figures/HISTORY.md and
// commit messages). Code blocks are not checked.
func TestDocsNameNoMachinesOrIssues(t *testing.T) {
	root := repoRoot(t)
	bad := history
	for _, file := range userDocs(t, root) {
		if file == "CHANGELOG.md" {
			continue // a history: what changed, which may name what it was found on
		}
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Error(err)
			continue
		}
		lines, numbers := prose(md)
		for i, l := range lines {
			if m := bad.FindString(l); m != "" {
				t.Errorf("%s:%d: %q (no machine names, driver versions, issue numbers or history in the docs)", file, numbers[i], strings.TrimSpace(m))
			}
		}
	}
}

// workLog matches what makes a page a work log rather than a summary:
// leases, sessions, issue numbers, what the morning's code did, what was
// once seen. BENCHMARKS.md names the machine it measured on; the log of
// how the figures came about is testdata/figures/HISTORY.md.
var workLog = regexp.MustCompile(`\b[Ll]eases?\b|\bthis session\b|\b(the )?morning\b|\bw(as|ere) seen\b|\b[Ii]ssues? #?\d+|(^|[\s(])#\d+\b|\breverted\b`)

// BENCHMARKS.md is one page a user reads in a few minutes, not a log.
func TestBenchmarksIsNoWorkLog(t *testing.T) {
	root := repoRoot(t)
	md, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines, numbers := prose(md)
	for i, l := range lines {
		if m := workLog.FindString(l); m != "" {
			t.Errorf("BENCHMARKS.md:%d: %q (the work log is testdata/figures/HISTORY.md)", numbers[i], strings.TrimSpace(m))
		}
	}
	if n := len(strings.Fields(string(md))); n > 1500 {
		t.Errorf("BENCHMARKS.md has %d words; keep it a page (1,500 at most) and the detail in testdata/figures/", n)
	}
}

// examples/README.md lists every example program.
func TestExamplesListed(t *testing.T) {
	root := repoRoot(t)
	list, err := os.ReadFile(filepath.Join(root, "examples", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := os.ReadDir(filepath.Join(root, "examples"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, "examples", d.Name(), "main.go")); err != nil {
			continue
		}
		n++
		for _, want := range []string{"`" + d.Name() + "`", "go run ./examples/" + d.Name()} {
			if !bytes.Contains(list, []byte(want)) {
				t.Errorf("examples/README.md does not list %s (%s)", d.Name(), want)
			}
		}
	}
	if n == 0 {
		t.Fatal("no examples found")
	}
}

// CI runs the README's first line that starts with "go test ": it must be
// the whole suite, in the Quick start, and the Quick start must say how to
// get the library and the command.
func TestReadmeQuickStart(t *testing.T) {
	root := repoRoot(t)
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(md)
	start := strings.Index(text, "\n## Quick start\n")
	if start < 0 {
		t.Fatal("README.md has no Quick start section")
	}
	end := strings.Index(text[start+1:], "\n## ")
	if end < 0 {
		t.Fatal("the Quick start is the last section")
	}
	quick := text[start : start+1+end]
	var first string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "go test ") {
			first = l
			break
		}
	}
	if first != "go test ./..." {
		t.Errorf("the README's first \"go test \" line (CI's test command) is %q, want \"go test ./...\"", first)
	}
	for _, want := range []string{"\ngo test ./...\n", "go get " + module, "go install " + module + "/cmd/cudamem@latest", "git clone", "CUDAMEM_REQUIRE_GPU", "docs/testing.md"} {
		if !strings.Contains(quick, want) {
			t.Errorf("the Quick start does not have %q", want)
		}
	}
	if i := strings.Index(text, "\n## "); i != start {
		t.Errorf("the Quick start is not the README's first section")
	}
	if n := len(strings.Fields(text)); n > 1500 {
		t.Errorf("README.md has %d words; keep it a front door (1,500 at most) and move detail to docs/", n)
	}
	if slices.Contains(strings.Split(text, "\n"), "## Reliability") {
		t.Error("README.md has a Reliability section: it lives in docs/reliability.md")
	}
}

func TestOutsidePattern(t *testing.T) {
	for text, want := range map[string]bool{
		"build it with ../shared/tools/gpu-pack --cgo-bench": true,
		"(`../../shared/reference/cuda.h`)":                  true,
		"see shared/tools/gpu-pack":                          true,
		"suballoc/mt/G/own and .../shared are G goroutines":  false,
		"scripts/gpu-pack --cgo-bench testdata/cgobench":     false,
	} {
		if got := outside.MatchString(text); got != want {
			t.Errorf("outside matches %q: %v, want %v", text, got, want)
		}
	}
}
