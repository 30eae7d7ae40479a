// Command cudamem reports on the CUDA driver and devices, and measures
// cudamem's costs beside a C baseline.
//
//	cudamem info [-json]           driver, devices, memory features, peers
//	cudamem bench [flags]          driver-call and memory benchmarks, with ratios to C
//	cudamem selftest               check every device's memory paths end to end
//	cudamem replay [flags]         replay an allocation trace on a resource: peak live and reserved memory
//	cudamem gentrace [flags]       write a generated allocation trace (serving, training, random)
//	cudamem timeline [flags]       a memory timeline (SVG) of a demo run or a JSON trace
//	cudamem fake-driver [-o DIR]   build the fake driver, to try cudamem without a GPU
//	cudamem version                cudamem's module version and the driver's (also -version)
//	cudamem help [COMMAND]         this list, or a command's usage and flags
//
// It needs no CUDA toolkit: the driver library is loaded at run time.
// Without a driver, the commands that need one say which paths they
// tried and exit with status 1. Every command prints its usage with -h
// (exit status 0); a bad flag or argument prints the error and the
// command's usage line, and exits with status 2.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
)

func main() {
	stop := removeTempsOnSignal(os.Stderr)
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	name, args, summary string
	run                 func(args []string, stdout, stderr io.Writer) error
}

// commands is set in init: the commands' flag parsing looks their usage
// lines up here, which a package-level initializer would make a cycle.
var commands []command

func init() {
	commands = []command{
		{"info", "[-json]", "show the CUDA driver, devices and their memory features (-json for JSON)", runInfo},
		{"bench", "[flags]", "measure driver calls, pool allocation and copies beside a C baseline", runBench},
		{"selftest", "", "allocate, copy and check memory on every device (pools, pinned, managed, VMM, peers)", runSelftest},
		{"replay", "[-resource NAME] [-in FILE | -gen KIND [-seed N]] [-json]", "replay an allocation trace (a file, or generated) on a resource and report peak live and reserved memory", runReplay},
		{"gentrace", "[-gen KIND] [-seed N] [-o FILE]", "write a generated allocation trace (serving, training or random; the same seed, the same trace)", runGentrace},
		{"timeline", "[flags]", "draw a memory timeline (SVG) of a demo workload, or of a JSON trace with -in", runTimeline},
		{"fake-driver", "[-o DIR]", "build cudamem's fake CUDA driver (host memory, no GPU; needs a C compiler) and say how to use it", runFakeDriver},
		{"version", "", "print cudamem's version and the driver's (also -version)", runVersion},
	}
}

func findCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: cudamem COMMAND [flags]\n       cudamem -version\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-12s %s\n\n", "help", "show this help, or a command's (cudamem help COMMAND)")
	b.WriteString("Run 'cudamem COMMAND -h' for a command's flags.\n")
	return b.String()
}

// usageLine is a command's one-line synopsis.
func usageLine(name string) string {
	line := "usage: cudamem " + name
	if c := findCommand(name); c != nil && c.args != "" {
		line += " " + c.args
	}
	return line
}

// errUsage marks errors that should print the command's usage line and
// exit with status 2.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return runHelp(args[1:], stdout, stderr)
	case "-version", "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	cmd := findCommand(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "cudamem: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	if wantsHelp(args[1:]) {
		printCommandHelp(stdout, cmd)
		return 0
	}
	err := cmd.run(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": ")
		fmt.Fprintf(stderr, "cudamem %s: %s\n%s\nRun 'cudamem %s -h' for details.\n", cmd.name, msg, usageLine(cmd.name), cmd.name)
		return 2
	}
	fmt.Fprintf(stderr, "cudamem %s: %v\n", cmd.name, err)
	return 1
}

// runHelp is `cudamem help [command]`.
func runHelp(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0 || wantsHelp(args) || (len(args) == 1 && args[0] == "help"):
		fmt.Fprint(stdout, usage())
		return 0
	case len(args) > 1:
		fmt.Fprintf(stderr, "cudamem help: takes one command name, got %q\nusage: cudamem help [COMMAND]\n", args)
		return 2
	}
	name := strings.TrimLeft(args[0], "-")
	if name == "version" || args[0] == "-version" || args[0] == "--version" {
		name = "version"
	}
	cmd := findCommand(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "cudamem help: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	printCommandHelp(stdout, cmd)
	return 0
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

// newFlagSet makes a command's flag set. The flag package prints nothing
// itself: parseFlags reports errors as usage errors (run prints them with
// the command's usage line) and prints the flags for -h.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args with fs. A bad flag or value is an error
// matching errUsage; -h prints the flags to fs's output and returns
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard) // the error comes back in err; run prints it
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.PrintDefaults()
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}

// printCommandHelp prints cmd's usage line, summary and flags, the flags as
// its flag set describes them.
func printCommandHelp(w io.Writer, cmd *command) {
	var flags strings.Builder
	cmd.run([]string{"-h"}, io.Discard, &flags) // only parses: -h stops it
	text := flags.String()
	fmt.Fprintf(w, "%s\n\n%s%s.\n", usageLine(cmd.name), strings.ToUpper(cmd.summary[:1]), cmd.summary[1:])
	if strings.TrimSpace(text) != "" {
		fmt.Fprintf(w, "\nflags:\n%s", text)
	}
}

// runVersion is `cudamem version` (and -version).
func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	printVersion(stdout)
	return nil
}

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
		if isFake(d.Path) {
			fmt.Fprintf(w, ", %s", fakeNote)
		}
		if err != nil {
			fmt.Fprintf(w, "; %v", err)
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprintf(w, "driver:  no driver (%v)\n", err)
	}
}

// plainError turns an argument error from cudamem's packages (it matches
// cuda.ErrInvalidArgument and names the method that refused, as a library
// error should) into the plain reason, for errors about the command line
// or a file it names, which are no CUDA errors: "trace version 9; this
// reader knows version 1", not "timeline.ReadJSON: cuda: invalid argument:
// trace version 9; ...". Every such prefix goes, also those an error
// message carries inside as text (a JSON decoder's error quotes the
// UnmarshalText error of a field). Other errors, and nil, are returned as
// they are.
func plainError(err error) error {
	if err == nil || !errors.Is(err, cuda.ErrInvalidArgument) {
		return err
	}
	return errors.New(argPrefix.ReplaceAllString(err.Error(), ""))
}

// argPrefix is an operation name and the ErrInvalidArgument text after it.
var argPrefix = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_.]*: )?` + regexp.QuoteMeta(cuda.ErrInvalidArgument.Error()+": "))

// deviceFlag is cuda.GetDevice for a -device flag's ordinal: one the
// machine does not have is a usage error naming the flag, a missing
// driver the paths tried.
func deviceFlag(ordinal int) (*cuda.Device, error) {
	dev, err := cuda.GetDevice(ordinal)
	switch {
	case err == nil:
		return dev, nil
	case errors.Is(err, cuda.ErrInvalidArgument):
		if n, nerr := cuda.DeviceCount(); nerr == nil {
			return nil, fmt.Errorf("%w: bad -device %d: this machine has %d GPU(s), ordinals from 0", errUsage, ordinal, n)
		}
		return nil, fmt.Errorf("%w: bad -device %d: %w", errUsage, ordinal, plainError(err))
	}
	return nil, describeLoadError(err)
}
