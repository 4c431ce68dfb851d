package main

import (
	"flag"
	"io"
	"regexp"
	"strings"
	"time"
)

// netlock's help and messages name a flag as --name (-v for a one-letter
// flag), whichever form the user typed: the flag package takes both. The
// helpers below turn the flag package's own -name into that style.

// flagName returns how messages name the flag name: --name, or -n.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// flagLine matches a flag's first line in flag.PrintDefaults's output.
var flagLine = regexp.MustCompile(`(?m)^  -([^\s]+)`)

// printFlags writes the flags of fs as flag.PrintDefaults does, naming them
// --name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	io.WriteString(w, flagLine.ReplaceAllStringFunc(b.String(), func(line string) string {
		return "  " + flagName(strings.TrimPrefix(line, "  -"))
	}))
}

// The flag package's parse errors (flag.FlagSet.failf), reworded by
// flagError.
var (
	errUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	errNoValue   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	errBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value (".*") for (?:flag )?-+([^:\s]+): (.*)$`)
)

// flagError rewords an error of fs.Parse in the --name style and, for a
// duration flag, says what it takes.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if m := errUndefined.FindStringSubmatch(msg); m != nil {
		return "unknown flag " + flagName(m[1])
	}
	if m := errNoValue.FindStringSubmatch(msg); m != nil {
		return flagName(m[1]) + " needs a value"
	}
	if m := errBadValue.FindStringSubmatch(msg); m != nil {
		why := m[3]
		if f := fs.Lookup(m[2]); f != nil {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, ok := g.Get().(time.Duration); ok {
					why = "want a duration such as 30s, 5m or 1m30s"
				}
			}
		}
		return "invalid value " + m[1] + " for " + flagName(m[2]) + ": " + why
	}
	return msg
}

// dashDashFirst reports whether fs.Parse(args) stopped at a "--" (which it
// drops) rather than at the first argument that is not a flag: in "run --
// echo hi" the lock name is missing, not "echo". A "--" that was the value
// of a flag (--prefix --) does not count.
func dashDashFirst(fs *flag.FlagSet, args []string) bool {
	i := len(args) - fs.NArg() - 1 // where the "--" would be
	if i < 0 || args[i] != "--" {
		return false
	}
	if i == 0 {
		return true
	}
	prev := args[i-1]
	if !strings.HasPrefix(prev, "-") || strings.Contains(prev, "=") {
		return true
	}
	f := fs.Lookup(strings.TrimLeft(prev, "-"))
	if f == nil {
		return true
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag() // a bool flag takes no value: "--" is ours
}
