package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/netlock-go/netlock"
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

// flagError rewords an error of fs.Parse in the --name style, a bad value
// as badValue does.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if m := errUndefined.FindStringSubmatch(msg); m != nil {
		return "unknown flag " + flagName(m[1])
	}
	if m := errNoValue.FindStringSubmatch(msg); m != nil {
		return flagName(m[1]) + " needs a value"
	}
	if m := errBadValue.FindStringSubmatch(msg); m != nil {
		value, err := strconv.Unquote(m[1])
		if err != nil {
			value = m[1]
		}
		why := m[3] // the want of the Values below
		if f := fs.Lookup(m[2]); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				why = "want true or false"
			}
		}
		return badValue(flagName(m[2]), value, why)
	}
	return msg
}

// badValue is the message for a bad value of a flag (name as flagName
// gives it) or of an environment variable ("$NETLOCK_REDIS"): one wording
// for all of them, naming the flag and the value. why says what is wrong,
// for a value out of range as "want …", what the flag takes.
func badValue(name, value, why string) string {
	return fmt.Sprintf("invalid value %q for %s: %s", value, name, why)
}

// The flag Values below check their range as they are set: the flag
// package then reports a bad value with their error, "want …", which
// flagError words as badValue does. Their String is the default that help
// shows; it must work on the zero Value, which flag.PrintDefaults makes.

// A durationValue is a duration flag that takes min up to max (no bound
// when max is 0).
type durationValue struct {
	p        *time.Duration
	min, max time.Duration
}

func (v *durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d < v.min || (v.max > 0 && d > v.max) {
		return errors.New("want " + v.want())
	}
	*v.p = d
	return nil
}

// want says which values v takes.
func (v *durationValue) want() string {
	switch {
	case v.max > 0 && v.min == 0:
		return fmt.Sprintf("a duration from 0 to %v, such as 1ms or 2s", v.max)
	case v.max > 0:
		return fmt.Sprintf("a duration from %v to %v", v.min, v.max)
	case v.min > 0:
		return fmt.Sprintf("a duration of at least %v, such as 8s, 30s or 1m30s", v.min)
	}
	return "a duration of 0 or more, such as 0, 30s or 1m30s"
}

// An intValue is a whole-number flag that takes min up to max (no bound
// when max is 0).
type intValue struct {
	p        *int
	min, max int
}

func (v *intValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < v.min || (v.max > 0 && n > v.max) {
		return errors.New("want " + v.want())
	}
	*v.p = n
	return nil
}

func (v *intValue) want() string {
	if v.max > 0 {
		return fmt.Sprintf("a whole number from %d to %d", v.min, v.max)
	}
	return fmt.Sprintf("a whole number from %d up", v.min)
}

// A choiceValue is a flag that takes one of a few words.
type choiceValue struct {
	p       *string
	choices []string
}

func (v *choiceValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *choiceValue) Set(s string) error {
	if !slices.Contains(v.choices, s) {
		return errors.New("want " + v.want())
	}
	*v.p = s
	return nil
}

func (v *choiceValue) want() string {
	n := len(v.choices)
	return strings.Join(v.choices[:n-1], ", ") + " or " + v.choices[n-1]
}

// A holderValue is a holder identity flag (netlock.WithHolderInfo's): at
// most netlock.MaxHolderInfo bytes of printable UTF-8, "" for none, the
// rule New applies (TestHolderFlagAgrees holds the two together).
type holderValue struct {
	p   *string
	set bool
}

func (v *holderValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *holderValue) Set(s string) error {
	want := fmt.Sprintf("want at most %d bytes of printable UTF-8 (no newline or tab)", netlock.MaxHolderInfo)
	if len(s) > netlock.MaxHolderInfo {
		return fmt.Errorf("%s; it is %d bytes", want, len(s))
	}
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], string(utf8.RuneError)):
			return fmt.Errorf("%s; byte %d is not UTF-8", want, i)
		case !unicode.IsPrint(r):
			return fmt.Errorf("%s; %U at byte %d is not printable", want, r, i)
		}
	}
	*v.p, v.set = s, true
	return nil
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

// A subcommand is what status, list and break share on their command line:
// a flag set with the connection flags, the usage error that names the
// command, and the parse that shows the help.
type subcommand struct {
	name, help     string // "status"; the text before the flags in --help
	fs             *flag.FlagSet
	cf             connFlags
	stdout, stderr io.Writer
}

// newSubcommand returns netlock name's command line, its connection flags
// registered; the caller adds its own flags to fs before parse.
func newSubcommand(name, help string, stdout, stderr io.Writer) *subcommand {
	c := &subcommand{name: name, help: help, fs: flag.NewFlagSet("netlock "+name, flag.ContinueOnError), stdout: stdout, stderr: stderr}
	c.fs.SetOutput(io.Discard) // errors and help are printed by parse and bad
	c.cf.register(c.fs, false)
	return c
}

// bad says what is wrong with the command line and returns exitUsage.
func (c *subcommand) bad(format string, a ...any) int {
	fmt.Fprintf(c.stderr, "netlock "+c.name+": "+format+"\n", a...)
	fmt.Fprintf(c.stderr, "Run \"netlock %s --help\" for usage.\n", c.name)
	return exitUsage
}

// parse parses args. When done, the caller exits with code: help was shown
// (exitOK) or a flag is bad (exitUsage, said on stderr).
func (c *subcommand) parse(args []string) (code int, done bool) {
	err := c.fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(c.stdout, c.help)
		printFlags(c.stdout, c.fs)
		return exitOK, true
	case err != nil:
		return c.bad("%s", flagError(c.fs, err)), true
	}
	return exitOK, false
}

// lockName returns the one NAME after the flags; when bad, the caller exits
// with code (exitUsage, said on stderr).
func (c *subcommand) lockName() (name string, code int, bad bool) {
	switch {
	case c.fs.NArg() == 0:
		return "", c.bad("missing the lock name: netlock %s [flags] NAME", c.name), true
	case c.fs.NArg() > 1:
		return "", c.bad("unexpected %q after the lock name: flags go before NAME", c.fs.Arg(1)), true
	}
	return c.fs.Arg(0), exitOK, false
}

// conn resolves the connection flags; when bad, the caller exits with code.
func (c *subcommand) conn() (cn *conn, code int, bad bool) {
	cn, err := c.cf.resolve(os.Getenv)
	if err != nil {
		return nil, c.bad("%v", err), true
	}
	return cn, exitOK, false
}
