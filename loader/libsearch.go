package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// EnvLibraryPath names the environment variable with extra directories
// (separated by os.PathListSeparator) that OpenCUDALibrary searches before
// any other place: for example the lib directory of a pip wheel such as
// nvidia-cublas-cu12 (site-packages/nvidia/cublas/lib).
const EnvLibraryPath = "CUDAMEM_LIBRARY_PATH"

// ErrLibraryNotFound is wrapped by OpenCUDALibrary's error when no
// candidate opened.
var ErrLibraryNotFound = errors.New("loader: CUDA library not found")

// LibraryError reports that OpenCUDALibrary found no loadable library. It
// lists every place tried, in order, and why each failed.
type LibraryError struct {
	Name     string    // the name asked for, e.g. "cublas"
	Attempts []Attempt // every path (or directory pattern) tried
}

func (e *LibraryError) Error() string {
	if e == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CUDA library %q not found", e.Name)
	for _, a := range e.Attempts {
		fmt.Fprintf(&b, "; tried %s: %v", a.Path, a.Err)
	}
	fmt.Fprintf(&b, " (install the CUDA toolkit or the library's package, or set %s to the directory that holds it)", EnvLibraryPath)
	return b.String()
}

// Is makes errors.Is(err, ErrLibraryNotFound) true.
func (e *LibraryError) Is(target error) bool { return target == ErrLibraryNotFound }

// majors are the soname versions tried in the system search, newest
// first: CUDA libraries version their sonames by their own major version
// (libcublas.so.12 and .13, libcufft.so.11 and .12, libcusolver.so.11).
var majors = []int{15, 14, 13, 12, 11, 10, 9}

// libBase reduces a library name to its base: "cublas", "libcublas",
// "libcublas.so", "libcublas.so.12", "cublas64_12.dll" all give "cublas".
// want is the exact file name asked for, when name was one ("" else).
func libBase(name string) (base, want string) {
	base = name
	if i := strings.Index(base, ".so"); i >= 0 {
		want, base = name, base[:i]
	} else if strings.HasSuffix(strings.ToLower(base), ".dll") {
		want, base = name, base[:len(base)-4]
		if i := strings.LastIndex(base, "64_"); i > 0 {
			base = base[:i]
		}
	}
	return strings.TrimPrefix(base, "lib"), want
}

// searchDirs lists the toolkit directories searched after the system
// search, for goos, from the environment.
func searchDirs(goos string, getenv func(string) string, glob func(string) ([]string, error)) []string {
	var dirs []string
	subdirs := []string{"lib64", "lib"}
	if goos == "windows" {
		subdirs = []string{filepath.Join("bin", "x64"), "bin"} // CUDA 13 moved the DLLs to bin\x64
	}
	for _, r := range []string{getenv("CUDA_PATH"), getenv("CUDA_HOME")} {
		for _, sub := range subdirs {
			if r != "" {
				dirs = append(dirs, filepath.Join(r, sub))
			}
		}
	}
	if goos == "windows" {
		return dedup(dirs)
	}
	dirs = append(dirs, "/usr/local/cuda/lib64")
	if m, err := glob("/usr/local/cuda/targets/*/lib"); err == nil {
		sort.Strings(m)
		dirs = append(dirs, m...)
	}
	// Versioned installs side by side, newest first.
	if m, err := glob("/usr/local/cuda-*/lib64"); err == nil {
		sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) })
		dirs = append(dirs, m...)
	}
	return dedup(dirs)
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

var digits = regexp.MustCompile(`[0-9]+`)

// versionLess compares the numbers in a and b in order ("cuda-12.10" after
// "cuda-12.9"), then the strings.
func versionLess(a, b string) bool {
	na, nb := digits.FindAllString(a, -1), digits.FindAllString(b, -1)
	for i := 0; i < len(na) && i < len(nb); i++ {
		x, _ := strconv.Atoi(na[i])
		y, _ := strconv.Atoi(nb[i])
		if x != y {
			return x < y
		}
	}
	if len(na) != len(nb) {
		return len(na) < len(nb)
	}
	return a < b
}

// systemNames are the names handed to the system's own search (dlopen's
// LD_LIBRARY_PATH and ld.so.cache; on Windows, OpenLibrary loads bare
// names from the system directory only, never from PATH or the working
// directory, where a planted DLL could be picked up: toolkit DLLs are found
// through CUDA_PATH or CUDAMEM_LIBRARY_PATH), newest first.
func systemNames(goos, base, want string) []string {
	var names []string
	if want != "" {
		names = append(names, want)
	}
	versioned, plain := "lib%s.so.%d", "lib"+base+".so"
	if goos == "windows" {
		versioned, plain = "%s64_%d.dll", base+".dll"
	}
	for _, m := range majors {
		names = append(names, fmt.Sprintf(versioned, base, m))
	}
	return dedup(append(names, plain))
}

// dirPattern is the glob of base's files in a directory.
func dirPattern(goos, dir, base string) string {
	if goos == "windows" {
		return filepath.Join(dir, base+"64_*.dll")
	}
	return filepath.Join(dir, "lib"+base+".so*")
}

// rankFiles orders the files a directory glob found: the highest major
// version first, and for one major the shortest name (the soname,
// libcublas.so.12, before libcublas.so.12.8.4.1); the unversioned name
// last.
func rankFiles(files []string, want string) []string {
	major := func(f string) int {
		b := filepath.Base(f)
		var rest string
		if i := strings.Index(b, ".so."); i >= 0 {
			rest = b[i+4:]
		} else if i := strings.LastIndex(b, "64_"); i >= 0 {
			rest = b[i+3:]
		} else {
			return -1
		}
		n := digits.FindString(rest)
		v, err := strconv.Atoi(n)
		if err != nil {
			return -1
		}
		return v
	}
	out := append([]string(nil), files...)
	sort.SliceStable(out, func(i, j int) bool {
		wi, wj := filepath.Base(out[i]) == want, filepath.Base(out[j]) == want
		if wi != wj {
			return wi
		}
		mi, mj := major(out[i]), major(out[j])
		if mi != mj {
			return mi > mj
		}
		if len(out[i]) != len(out[j]) {
			return len(out[i]) < len(out[j])
		}
		return out[i] < out[j]
	})
	return out
}

// step is one place to look: a name for the system search (dir == ""), or
// a directory to glob.
type step struct {
	dir, name, pattern string
}

// paths lists what s tries, in order: its name, or the files its glob
// finds now (want, the exact name asked for, first), or why there are none.
func (s step) paths(want string) ([]string, error) {
	if s.dir == "" {
		return []string{s.name}, nil
	}
	m, err := filepath.Glob(s.pattern)
	if err == nil && len(m) == 0 {
		err = fs.ErrNotExist
	}
	if err != nil {
		return nil, err
	}
	return rankFiles(m, want), nil
}

func searchSteps(name, goos string, getenv func(string) string, glob func(string) ([]string, error)) []step {
	if strings.ContainsRune(name, '/') || (goos == "windows" && strings.ContainsAny(name, `\:`)) {
		return []step{{name: name}}
	}
	base, want := libBase(name)
	var steps []step
	// The user's own directories come before everything else.
	for _, d := range dedup(filepath.SplitList(getenv(EnvLibraryPath))) {
		if d != "" {
			steps = append(steps, step{dir: d, pattern: dirPattern(goos, d, base)})
		}
	}
	for _, n := range systemNames(goos, base, want) {
		steps = append(steps, step{name: n})
	}
	for _, d := range searchDirs(goos, getenv, glob) {
		steps = append(steps, step{dir: d, pattern: dirPattern(goos, d, base)})
	}
	return steps
}

// LibraryCandidates returns, in order, what OpenCUDALibrary tries for
// name: a path if name is one; otherwise the directories of
// CUDAMEM_LIBRARY_PATH, then the system search by soname (libNAME.so.N,
// newest major first, then libNAME.so; NAME64_N.dll on Windows), then the
// toolkit's directories: $CUDA_PATH/lib64 and lib, $CUDA_HOME/lib64 and
// lib, /usr/local/cuda/lib64, /usr/local/cuda/targets/*/lib and
// /usr/local/cuda-*/lib64, newest first (CUDA_PATH\bin\x64 and
// CUDA_PATH\bin on Windows). Directory entries are the files found there
// now, or the glob pattern when none is.
func LibraryCandidates(name string) []string {
	var out []string
	_, want := libBase(name)
	for _, s := range searchSteps(name, runtime.GOOS, os.Getenv, filepath.Glob) {
		paths, err := s.paths(want)
		if err != nil {
			paths = []string{s.pattern}
		}
		out = append(out, paths...)
	}
	return out
}

// OpenCUDALibrary opens a CUDA library by its short name ("cublas",
// "cufft", "nvrtc", ...; a soname such as "libcublas.so.12", or a path, is
// taken too) from the places LibraryCandidates lists, so that a library
// only in /usr/local/cuda/lib64 opens without LD_LIBRARY_PATH. The first
// that opens wins. On failure the *LibraryError lists every path tried
// and why each failed; it matches ErrLibraryNotFound (errors.Is).
//
// A library opened from a directory may need others from the same
// directory that the system search cannot find (libcublas.so.12 needs
// libcublasLt.so.12): when dlopen names such a dependency and the
// directory has it, that dependency is opened first and stays loaded for
// the life of the process.
//
// Functions looked up in the library (Library.Lookup) are called with
// Proc.Call; to have a CUDA context made current for them, bind them with
// Driver.Bind, or use package cuda's Device.Foreign.
func OpenCUDALibrary(name string) (*Library, error) {
	if name == "" {
		return nil, fmt.Errorf("OpenCUDALibrary: %w: empty library name", ErrInvalidArgument)
	}
	le := &LibraryError{Name: name}
	_, want := libBase(name)
	for _, s := range searchSteps(name, runtime.GOOS, os.Getenv, filepath.Glob) {
		paths, err := s.paths(want)
		if err != nil {
			le.Attempts = append(le.Attempts, Attempt{s.pattern, err})
			continue
		}
		open := openWithDeps // a directory's file may need its neighbours
		if s.dir == "" {
			open = OpenLibrary
		}
		for _, p := range paths {
			l, err := open(p)
			if err == nil {
				return l, nil
			}
			le.Attempts = append(le.Attempts, Attempt{p, err})
		}
	}
	return nil, le
}

// missingDep finds the dependency dlopen could not find in its message
// ("libcublasLt.so.12: cannot open shared object file: ...").
var missingDep = regexp.MustCompile(`([A-Za-z0-9_.+-]+\.so[0-9.]*): cannot open shared object file`)

// deps keeps the dependencies openWithDeps loaded, for the life of the
// process (the libraries that need them may be open).
var deps = struct {
	sync.Mutex
	libs map[string]*Library
}{libs: map[string]*Library{}}

// openWithDeps opens path; when the loader reports a missing dependency
// that path's directory holds, it opens that first and tries again.
func openWithDeps(path string) (*Library, error) {
	return openWithDepsIn(path, map[string]bool{path: true})
}

// openWithDepsIn is openWithDeps with the set of libraries being opened up
// the call chain: two libraries of a directory that need each other (a
// DT_NEEDED cycle) end in an error instead of an unbounded recursion.
func openWithDepsIn(path string, opening map[string]bool) (*Library, error) {
	dir := filepath.Dir(path)
	var tried []string
	for range 16 {
		l, err := OpenLibrary(path)
		if err == nil {
			return l, nil
		}
		m := missingDep.FindStringSubmatch(err.Error())
		if m == nil || filepath.Base(m[1]) == filepath.Base(path) {
			return nil, err
		}
		dep := filepath.Join(dir, filepath.Base(m[1]))
		if _, serr := os.Stat(dep); serr != nil {
			return nil, err
		}
		if slices.Contains(tried, dep) {
			return nil, err // it did not help
		}
		if opening[dep] {
			return nil, fmt.Errorf("%w (%s and %s need each other)", err, path, dep)
		}
		tried = append(tried, dep)
		opening[dep] = true
		dl, derr := openWithDepsIn(dep, opening)
		delete(opening, dep)
		if derr != nil {
			return nil, fmt.Errorf("%w; opening its dependency %s: %w", err, dep, derr)
		}
		deps.Lock()
		if old := deps.libs[dep]; old != nil {
			dl.Close() // already held once: dlopen counts, keep one
		} else {
			deps.libs[dep] = dl
		}
		deps.Unlock()
	}
	return nil, fmt.Errorf("dlopen %s: too many missing dependencies", path)
}
