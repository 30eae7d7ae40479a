// Command cudamem reports on the CUDA driver and devices, and measures
// cudamem's costs beside a C baseline.
//
//	cudamem info [-json]      driver, devices, memory features, peers
//	cudamem bench [flags]     driver-call and memory benchmarks, with ratios to C
//	cudamem selftest          check every device's memory paths end to end
//	cudamem timeline [flags]  a memory timeline (SVG) of a demo run or a JSON trace
//	cudamem -version          cudamem's module version and the driver's
//
// It needs no CUDA toolkit: the driver library is loaded at run time.
// Without a driver, info says what it tried and exits with status 1.
// Every command prints its usage with -h (exit status 0); a bad flag or
// argument exits with status 2.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand. Its flag set writes the flag package's
// messages (errors, -h) to stderr.
type command struct {
	name, args, summary string
	run                 func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"info", "[-json]", "show the CUDA driver, devices and their memory features (-json for JSON)", runInfo},
	{"bench", "[flags]", "measure driver calls, pool allocation and copies beside a C baseline", runBench},
	{"selftest", "", "allocate, copy and check memory on every device (pools, pinned, managed, VMM, peers)", runSelftest},
	{"timeline", "[flags]", "draw a memory timeline (SVG) of a demo workload, or of a JSON trace with -in", runTimeline},
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: cudamem <command> [flags]\n       cudamem -version\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString("  version   print cudamem's version and the driver's (also -version)\n")
	b.WriteString("  help      show this help\n\nRun 'cudamem <command> -h' for a command's flags.\n")
	return b.String()
}

// errUsage marks errors that should print the usage text.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	case "version", "-version", "--version":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "cudamem: version takes no arguments, got %q\n", args[1:])
			return 2
		}
		printVersion(stdout)
		return 0
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "cudamem: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	if wantsHelp(args[1:]) {
		printCommandHelp(stdout, cmd)
		return 0
	}
	rec := &firstWrite{w: stderr}
	err := cmd.run(args[1:], stdout, rec)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case rec.startsWith(err.Error() + "\n"):
		// A bad flag: the flag package printed the error and the flags.
		return 2
	case errors.Is(err, errUsage):
		msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": ")
		fmt.Fprintf(stderr, "cudamem %s: %s\nRun 'cudamem %s -h' for usage.\n", cmd.name, msg, cmd.name)
		return 2
	}
	fmt.Fprintf(stderr, "cudamem %s: %v\n", cmd.name, err)
	return 1
}

// wantsHelp reports whether the flags before the first argument (or "--")
// ask for help.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch {
		case a == "--" || !strings.HasPrefix(a, "-"):
			return false
		case a == "-h" || a == "-help" || a == "--help":
			return true
		}
	}
	return false
}

// printCommandHelp prints cmd's usage line, summary and flags, the flags as
// its flag set describes them.
func printCommandHelp(w io.Writer, cmd *command) {
	var flags bytes.Buffer
	cmd.run([]string{"-h"}, io.Discard, &flags) // only parses: -h stops it
	text := flags.String()
	if i := strings.IndexByte(text, '\n'); i >= 0 && strings.HasPrefix(text, "Usage of ") {
		text = text[i+1:]
	}
	line := "usage: cudamem " + cmd.name
	if cmd.args != "" {
		line += " " + cmd.args
	}
	fmt.Fprintf(w, "%s\n\n%s%s.\n", line, strings.ToUpper(cmd.summary[:1]), cmd.summary[1:])
	if strings.TrimSpace(text) != "" {
		fmt.Fprintf(w, "\nflags:\n%s", text)
	}
}

// firstWrite passes writes through and keeps the start of what was
// written, so run can tell an error the flag package already printed.
type firstWrite struct {
	w    io.Writer
	head []byte
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if n := 4096 - len(f.head); n > 0 {
		f.head = append(f.head, p[:min(n, len(p))]...)
	}
	return f.w.Write(p)
}

func (f *firstWrite) startsWith(s string) bool { return bytes.HasPrefix(f.head, []byte(s)) }

// moduleVersion is cudamem's module version from the build information:
// a tag such as v1.2.0 when built with `go install ...@version`, "(devel)"
// for a build from a checkout.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := bi.Main.Version
	if bi.Main.Path != "github.com/cudamem/cudamem" {
		// Built into another module's binary: find cudamem among its deps.
		v = ""
		for _, d := range bi.Deps {
			if d.Path == "github.com/cudamem/cudamem" {
				v = d.Version
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "cudamem %s, built with %s for %s/%s\n", moduleVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	d, err := loader.Load()
	var le *loader.LoadError
	switch {
	case errors.As(err, &le):
		fmt.Fprintln(w, "driver:  no driver ('cudamem info' lists the paths tried)")
	case d != nil:
		fmt.Fprintf(w, "driver:  CUDA %s (%s)", cuda.VersionString(d.Version), d.Path)
		if err != nil {
			fmt.Fprintf(w, "; %v", err)
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprintf(w, "driver:  no driver (%v)\n", err)
	}
}
