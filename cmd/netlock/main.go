// Command netlock runs programs under a netlock distributed lock, shows
// locks, and demonstrates the library.
//
// Usage:
//
//	netlock <command> [flags]
//
// Commands:
//
//	run     run a program while holding a lock (flock(1) over Redis) or leading an election
//	once    run a program once across every host that runs it (a migration, a cron tick)
//	status  show whether a lock is held, on each Redis node
//	list    list the locks held, on each Redis node
//	break   end a lock's hold by force and let the first waiter in
//	leader  show who leads an election, or watch it change
//	demo    run a lost-update race on a Redis counter, without and with a NetMutex
//	help    show help for netlock or for one command
//	version show netlock's version (also --version)
//
// Run "netlock <command> --help" for the flags of a command, "netlock
// --version" for the version.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// A command is one sub-command of netlock. run gets the arguments after the
// command's name and returns the process exit code (see exit.go).
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands lists the sub-commands, in the order "netlock help" shows them.
// To add one, append it here and put its code in its own file.
var commands = []command{
	{name: "run", summary: "run a program while holding a lock (flock(1) over Redis) or leading an election", run: runRun},
	{name: "once", summary: "run a program once across every host that runs it (a migration, a cron tick)", run: runOnce},
	{name: "status", summary: "show whether a lock is held, on each Redis node", run: runStatus},
	{name: "list", summary: "list the locks held, on each Redis node", run: runList},
	{name: "break", summary: "end a lock's hold by force and let the first waiter in", run: runBreak},
	{name: "leader", summary: "show who leads an election, or watch it change", run: runLeader},
	{name: "demo", summary: "run a lost-update race on a Redis counter, without and with a NetMutex", run: runDemo},
}

// main runs the command with a context that never ends: each command handles
// the signals it cares about (demo stops on SIGINT and SIGTERM; run forwards
// them to its program).
func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args (without the program name) to a sub-command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if name == "help" && len(rest) > 0 {
			if c := lookup(rest[0]); c != nil {
				return c.run(ctx, []string{"--help"}, stdout, stderr)
			}
			fmt.Fprintf(stderr, "netlock help: unknown command %q\n\n", rest[0])
			usage(stderr)
			return exitUsage
		}
		usage(stdout)
		return exitOK
	case "version", "-version", "--version":
		if len(rest) > 0 {
			fmt.Fprintf(stderr, "netlock %s: unexpected %q\n", name, rest[0])
			return exitUsage
		}
		fmt.Fprintln(stdout, version(debug.ReadBuildInfo()))
		return exitOK
	}
	if c := lookup(name); c != nil {
		return c.run(ctx, rest, stdout, stderr)
	}
	fmt.Fprintf(stderr, "netlock: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprint(w, "netlock runs programs under a distributed lock on Redis, shows locks,\nand demonstrates the netlock library.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tnetlock <command> [flags]\n\nCommands:\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-8s%s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\t%-8s%s\n", "help", "show this help, or \"netlock help <command>\" for one command")
	fmt.Fprintf(w, "\t%-8s%s\n", "version", "show netlock's version (also --version)")
	fmt.Fprint(w, "\nRun \"netlock <command> --help\" for the flags and exit codes of a command.\n")
	fmt.Fprintf(w, "Bad usage exits with %d (EX_USAGE), Redis out of reach with %d (EX_UNAVAILABLE).\n", exitUsage, exitUnavailable)
}
