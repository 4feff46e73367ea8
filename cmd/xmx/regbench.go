package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/xmx-stack/xmx/regcache"
)

// runRegBench measures the seed's Fig. 6: the cost of registering memory,
// of copying it, and of a pin-down cache hit, per buffer size.
func runRegBench(args []string) error {
	fs := flag.NewFlagSet("regbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx regbench [flags]

Reproduces the seed's Fig. 6 on this machine: for each size, the cost of a
registration (mlock included, then deregistration), of a memcpy of the same
size, and of a pin-down cache hit, and the smallest size at which a copy
costs more than a registration. Registration locks memory: run as root or
with a large enough RLIMIT_MEMLOCK.

`)
		fs.PrintDefaults()
	}
	sizes := fs.String("sizes", "", "comma-separated sizes (default 64 B to 4 MiB by 4)")
	minTime := fs.Duration("time", 300*time.Millisecond, "minimum measuring time per figure")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	var list []int
	if *sizes != "" {
		var err error
		if list, err = parseSizes(*sizes, 0, 0, 2); err != nil {
			return err
		}
		if slices.Contains(list, 0) {
			return fmt.Errorf("%w: -sizes %s: a region to register has at least 1 byte", errUsage, *sizes)
		}
	}
	// Each size takes about nine times -time (three figures, three
	// rounds each).
	if err := checkRunTime("-time", *minTime, 0); err != nil {
		return err
	}
	_, err := regcache.Fig6(os.Stdout, list, *minTime)
	return err
}
