package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// rankConfig is one rank process's part.
type rankConfig struct {
	rank, ranks int
	device      int // the GPU's ordinal; -1: rank modulo the local GPU count
	idPath      string
	size        uint64
	iters       int
	idWait      time.Duration // how long ranks other than 0 wait for the id file
}

// runRank is one rank of a communicator whose ranks are processes: rank 0
// makes the ncclUniqueId and publishes it in the id file, the others read
// it from there, and each joins with ncclCommInitRankScalable.
func runRank(c rankConfig) (res Result, err error) {
	switch {
	case c.ranks < 1 || c.rank < 0 || c.rank >= c.ranks:
		return res, fmt.Errorf("rank %d of %d: want 0 ≤ rank < ranks", c.rank, c.ranks)
	case c.idPath == "":
		return res, errors.New("-rank needs -id, the file through which rank 0 gives the others its ncclUniqueId")
	case c.size == 0 || c.size%4 != 0 || c.iters < 1:
		return res, fmt.Errorf("size must be a positive multiple of 4 bytes and iters at least 1 (got %d bytes, %d iters)", c.size, c.iters)
	}
	devs, err := cuda.Devices()
	if err != nil {
		return res, devicesErr(err)
	}
	ord := c.device
	if ord < 0 {
		ord = c.rank % len(devs)
	}
	if ord >= len(devs) {
		return res, fmt.Errorf("-device %d: this machine has %d GPU(s)", ord, len(devs))
	}
	dev := devs[ord]
	n, err := openNCCL()
	if err != nil {
		return res, err // names the library and the paths tried, and how to add one
	}
	if err := n.need("one process per rank needs NCCL 2.23 or later (ncclCommInitRank takes the 128-byte ncclUniqueId by value, which cudamem's calls, integer and pointer arguments only, cannot pass; ncclCommInitRankScalable takes it by pointer)",
		&n.getUniqueID, &n.commInitRankScalable); err != nil {
		return res, err
	}
	res = Result{Ranks: c.ranks, Local: []int{c.rank}, GPUs: []int{ord}, Bytes: c.size, NCCLVersion: n.version, Library: n.path}

	var id [ncclUniqueIDBytes]byte
	if c.rank == 0 {
		get, err := dev.Foreign(n.getUniqueID)
		if err != nil {
			return res, err
		}
		r, cerr := get.Call(uintptr(unsafe.Pointer(&id[0])))
		if err := n.check("ncclGetUniqueId", r, cerr); err != nil {
			return res, err
		}
		if err := publishID(c.idPath, id); err != nil {
			return res, err
		}
	} else if id, err = awaitID(c.idPath, c.idWait); err != nil {
		return res, fmt.Errorf("rank %d: %w", c.rank, err)
	}

	initRank, err := dev.Foreign(n.commInitRankScalable)
	if err != nil {
		return res, err
	}
	var comm uintptr
	// One id (nId 1); a NULL config takes NCCL's defaults, as
	// NCCL_CONFIG_INITIALIZER would. Blocks until every rank has joined.
	r, cerr := initRank.Call(uintptr(unsafe.Pointer(&comm)), uintptr(c.ranks), uintptr(c.rank), 1, uintptr(unsafe.Pointer(&id[0])), 0)
	if err := n.check("ncclCommInitRankScalable", r, cerr); err != nil {
		return res, fmt.Errorf("rank %d of %d on %v: %w", c.rank, c.ranks, dev, err)
	}
	g := &group{n: n, nranks: c.ranks}
	defer func() {
		for _, rk := range g.ranks {
			err = errors.Join(err, rk.close())
		}
		err = errors.Join(err, n.check("ncclCommDestroy", n.commDestroy.Call(comm), nil))
	}()
	rk, err := g.newRank(c.rank, dev, comm)
	if err != nil {
		return res, err
	}
	g.ranks = []*rank{rk}
	err = g.phases(&res, c.size, c.iters)
	return res, err
}

// publishID writes id to path, which must not exist: to a private
// temporary file first, then linked into place, so a reader sees the
// whole id or nothing, and a stale id from an earlier run is refused
// rather than overwritten (a rank reading it would join no one).
func publishID(path string, id [ncclUniqueIDBytes]byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nccl-id-*")
	if err != nil {
		return fmt.Errorf("ncclUniqueId file: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(id[:])
	err = errors.Join(err, tmp.Close())
	if err != nil {
		return fmt.Errorf("ncclUniqueId file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("ncclUniqueId file %s exists (from an earlier run?): remove it, or name a fresh path with -id", path)
		}
		return fmt.Errorf("ncclUniqueId file: %w", err)
	}
	return nil
}

// awaitID waits up to wait for the id file rank 0 publishes.
func awaitID(path string, wait time.Duration) (id [ncclUniqueIDBytes]byte, err error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(path)
		switch {
		case err == nil && len(b) == len(id):
			copy(id[:], b)
			return id, nil
		case err == nil:
			return id, fmt.Errorf("ncclUniqueId file %s holds %d bytes, want %d", path, len(b), len(id))
		case !errors.Is(err, os.ErrNotExist):
			return id, fmt.Errorf("ncclUniqueId file: %w", err)
		case time.Now().After(deadline):
			return id, fmt.Errorf("no ncclUniqueId at %s after %v (is rank 0 running, with the same -id?)", path, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// starter makes the command that runs one rank with the given flags.
type starter func(args []string) (*exec.Cmd, error)

// selfStarter runs this executable again.
func selfStarter(args []string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, args...), nil
}

// launch runs ranks rank processes, one per GPU, through start, and
// returns their Results by rank. It checks first what would make every
// rank fail (no driver, too few GPUs, no NCCL or one without
// ncclCommInitRankScalable), so that it says so once.
func launch(ranks, mib, iters int, timeout time.Duration, start starter, out io.Writer) ([]Result, error) {
	devs, err := cuda.Devices()
	if err != nil {
		return nil, devicesErr(err)
	}
	if ranks > len(devs) {
		return nil, fmt.Errorf("-ranks %d needs %d GPUs (one per rank: NCCL refuses two ranks on one GPU); this machine has %d", ranks, ranks, len(devs))
	}
	n, err := openNCCL()
	if err != nil {
		return nil, err // names the library and the paths tried, and how to add one
	}
	if err := n.need("one process per rank needs NCCL 2.23 or later (ncclCommInitRank takes the 128-byte ncclUniqueId by value, which cudamem's calls cannot pass)",
		&n.getUniqueID, &n.commInitRankScalable); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "nccl-allreduce-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	return spawn(ranks, func(i int) []string {
		return []string{"-ranks", strconv.Itoa(ranks), "-rank", strconv.Itoa(i), "-device", strconv.Itoa(i),
			"-id", filepath.Join(dir, "nccl-unique-id"), "-mib", strconv.Itoa(mib), "-iters", strconv.Itoa(iters),
			"-timeout", timeout.String()}
	}, timeout, start, out)
}

// spawn starts ranks processes (start(args(i)) for rank i), copies their
// output to out with a "[rank i] " prefix, and collects the Result each
// prints on its resultPrefix line. When one fails, or timeout passes, the
// others are killed: they would wait for it in NCCL forever.
func spawn(ranks int, args func(i int) []string, timeout time.Duration, start starter, out io.Writer) ([]Result, error) {
	var outMu sync.Mutex
	type proc struct {
		cmd    *exec.Cmd
		res    *Result
		stderr bytes.Buffer // the last lines, for the error
		err    error
	}
	procs := make([]*proc, ranks)
	var procMu sync.Mutex // procs and killed, between this loop and the waiters
	killed := false
	killAll := func() {
		procMu.Lock()
		defer procMu.Unlock()
		killed = true
		for _, p := range procs {
			if p != nil {
				_ = p.cmd.Process.Kill()
			}
		}
	}
	var wg sync.WaitGroup
	var startErr error
	for i := range ranks {
		cmd, err := start(args(i))
		if err != nil {
			startErr = err
			break
		}
		p := &proc{cmd: cmd}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			startErr = err
			break
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			startErr = err
			break
		}
		if err := cmd.Start(); err != nil {
			startErr = fmt.Errorf("rank %d: %w", i, err)
			break
		}
		procMu.Lock()
		procs[i] = p
		if killed { // a rank started earlier has failed already
			_ = cmd.Process.Kill()
		}
		procMu.Unlock()
		prefix := fmt.Sprintf("[rank %d] ", i)
		copyLines := func(r io.Reader, keep *bytes.Buffer, parse bool) {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if parse && strings.HasPrefix(line, resultPrefix) {
					var res Result
					if err := json.Unmarshal([]byte(line[len(resultPrefix):]), &res); err != nil {
						p.err = fmt.Errorf("rank %d: unreadable result: %w", i, err)
					} else {
						p.res = &res
					}
					continue
				}
				if keep != nil {
					keep.WriteString(line + "\n")
				}
				outMu.Lock()
				fmt.Fprintln(out, prefix+line)
				outMu.Unlock()
			}
		}
		var pipes sync.WaitGroup
		pipes.Add(2)
		go func() { defer pipes.Done(); copyLines(stdout, nil, true) }()
		go func() { defer pipes.Done(); copyLines(stderr, &p.stderr, false) }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipes.Wait() // before Wait, which closes the pipes
			if err := cmd.Wait(); err != nil {
				p.err = fmt.Errorf("rank %d: %w: %s", i, err, lastLine(p.stderr.String()))
				killAll()
			}
		}()
	}
	if startErr != nil {
		killAll()
		wg.Wait()
		return nil, startErr
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timedOut := false
	select {
	case <-done:
	case <-time.After(timeout):
		timedOut = true
		killAll()
		<-done
	}
	var errs []error
	var rs []Result
	for i, p := range procs {
		switch {
		case p.err != nil:
			errs = append(errs, p.err)
		case p.res == nil:
			errs = append(errs, fmt.Errorf("rank %d exited without a result", i))
		default:
			rs = append(rs, *p.res)
		}
	}
	if timedOut {
		errs = append([]error{fmt.Errorf("%d ranks: not done after %v; killed", ranks, timeout)}, errs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(rs, func(a, b int) bool { return rs[a].Local[0] < rs[b].Local[0] })
	return rs, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	if s == "" {
		return "(no output on stderr)"
	}
	return s
}
