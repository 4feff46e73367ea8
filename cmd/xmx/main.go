// Command xmx is the user's tool for the xmx messaging stack.
//
//	xmx info [flags] [IFACE]      interfaces and their XDP abilities, counters of the open endpoints
//	xmx pingpong [flags] [PEER]   latency per message size (server without PEER)
//	xmx stream [flags] [PEER]     bandwidth with a window of messages in flight
//	xmx linkbench [flags]         measure the links (AF_XDP, AF_PACKET, the asavie/xdp floor) in a veth lab
//	xmx regbench [flags]          registration vs memcpy vs pin-down cache hit (the seed's Fig. 6)
//	xmx manyclients [flags]       one server, many client endpoints (the seed's Fig. 9)
//
// Run "xmx COMMAND -h" for the flags of a command.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// A command is one subcommand of xmx.
type command struct {
	summary string
	run     func(args []string) error
}

var commands = map[string]command{
	"linkbench": {"measure link round trips and frame rates in a fresh veth lab", runLinkBench},
	"pingpong":  {"latency tool: serve, or measure round trips to a peer per message size", runPingPong},
	"stream":    {"bandwidth tool: serve, or stream messages to a peer with a window", runStream},
	"regbench":  {"registration vs memcpy vs pin-down cache hit per size (the seed's Fig. 6)", runRegBench},
	"info":      {"interfaces (driver, queues, XDP features, attached program) and the counters of open endpoints", runInfo},

	"manyclients": {"many clients write to one server (the seed's Fig. 9): serve, or run N clients", runManyClients},
}

// errUsage marks errors in the command line (exit status 2).
var errUsage = errors.New("usage")

// errServerLimit marks a command line the server refuses by its own limits:
// a usage error (exit status 2) whose message names the server's flag to
// change, so the tool does not point at its own -h.
var errServerLimit = fmt.Errorf("%w", errUsage)

// usageMessage is a usage error's message without the mark: the mark
// says where the error lies (the exit status), the message what it is.
// The mark goes wherever a wrapper put it ("endpoint 3: usage: -i ...").
func usageMessage(err error) string {
	return strings.Replace(err.Error(), errUsage.Error()+": ", "", 1)
}

// maxRunTime bounds every flag that sets how long a measurement runs
// (-time, -duration, -stream-time, -drain): every loop of xmx ends by
// itself.
const maxRunTime = time.Hour

// checkRunTime refuses a duration flag that is not positive, shorter than
// least (0: any positive duration) or longer than maxRunTime.
func checkRunTime(flag string, d, least time.Duration) error {
	if d <= 0 || d < least || d > maxRunTime {
		want := "a positive duration up to"
		if least > 0 {
			want = fmt.Sprintf("a duration from %v to", least)
		}
		return fmt.Errorf("%w: %s %v: want %s %v", errUsage, flag, d, want, maxRunTime)
	}
	return nil
}

// parseFlags parses a command's flags. A bad flag comes back as a usage
// error, which main prints once with a pointer to -h; only -h itself
// prints the flags (the flag package would print them after every error,
// and main the error again below them).
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

func usage() { writeUsage(os.Stderr) }

// writeUsage lists the commands, their summaries in a column of their own.
func writeUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: xmx COMMAND [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	width := 0
	for n := range commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun \"xmx COMMAND -h\" for the flags of a command.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "xmx: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if errors.Is(err, errUsage) {
			hint := fmt.Sprintf(" (xmx %s -h lists the flags)", os.Args[1])
			if errors.Is(err, errServerLimit) {
				hint = "" // the message names the server's flag
			}
			fmt.Fprintf(os.Stderr, "xmx %s: %s%s\n", os.Args[1], usageMessage(err), hint)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "xmx %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// requireRoot explains what to do when the command needs privileges.
func requireRoot(what string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs root (AF_XDP, BPF and network namespaces): run it with sudo", what)
	}
	return nil
}
