package netlock_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The documentation: README.md, CONTRIBUTING.md and the guides in docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(guides) == 0 {
		t.Fatal("no guide in docs/")
	}
	return append([]string{"README.md", "CONTRIBUTING.md"}, guides...)
}

// A snippet is one ```go block of a document.
type snippet struct {
	file string // the document, relative to the repository's root
	line int    // line of the block's first line of code
	code string
}

// complete reports whether the snippet is a whole Go file (a program, such
// as the README's quick start) rather than statements.
func (s snippet) complete() bool { return strings.HasPrefix(s.code, "package ") }

func goSnippets(t *testing.T, file string) []snippet {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []snippet
		cur  *snippet
		body strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{file: file, line: n + 1}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.code = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: ```go block not closed", file, cur.line-1)
	}
	return out
}

// What a statement snippet may use without declaring it: a reader's own
// program has these. Snippets that need more are written as whole files.
const snippetPrelude = `package snippets

import (
	"context"
	"database/sql"
	"log/slog"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
)

var (
	ctx                       context.Context
	backends                  []netlock.Backend
	pool                      *redigo.Pool
	rdb                       *redis.Client
	client                    rueidis.Client
	clientA, clientB, clientC rueidis.Client
	mu                        *netlock.NetMutex
	db                        *sql.DB
	logger                    *slog.Logger
	account, card, invoiceID  string
	amount                    int64
	config                    map[string]string
)

func readBalance(ctx context.Context, account string) (int64, error)     { return 0, nil }
func writeBalance(ctx context.Context, account string, v int64) error    { return nil }
func charge(ctx context.Context, card string) error                      { return nil }
func rebuild(ctx context.Context, token uint64) (map[string]string, error) { return nil, nil }
func nextQuestion(ctx context.Context) (string, error)                   { return "", nil }
func sendReport(ctx context.Context) error                               { return nil }
func migrate(ctx context.Context) error                                  { return nil }
`

// The packages a statement snippet may name; each file of snippets imports
// them all and uses each once, so that a snippet need not use every one.
var snippetImports = []struct{ path, name, use string }{
	{"context", "context", "context.Background"},
	{"errors", "errors", "errors.Is"},
	{"fmt", "fmt", "fmt.Println"},
	{"log/slog", "slog", "slog.Default"},
	{"os", "os", "os.Exit"},
	{"sync", "sync", "sync.OnceFunc"},
	{"time", "time", "time.Now"},
	{"github.com/gomodule/redigo/redis", "redigo", "redigo.DialContext"},
	{"github.com/redis/go-redis/v9", "redis", "redis.NewClient"},
	{"github.com/redis/rueidis", "rueidis", "rueidis.NewClient"},
	{"github.com/netlock-go/netlock", "netlock", "netlock.New"},
	{"github.com/netlock-go/netlock/goredis", "goredis", "goredis.New"},
	{"github.com/netlock-go/netlock/otelnetlock", "otelnetlock", "otelnetlock.NewObserver"},
}

// TestDocSnippetsBuild builds every ```go block of the documentation (docFiles)
// against this checkout, in a module of its own as a user's program would
// be: a whole file (the README's quick start) as a program of its own,
// statements as the body of a function that returns an error, beside
// snippetPrelude. Errors name the document's lines. It runs the go command
// offline: the modules come from the module cache.
func TestDocSnippetsBuild(t *testing.T) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	goTool, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatal(err)
	}

	var all []snippet
	for _, f := range docFiles(t) {
		all = append(all, goSnippets(t, f)...)
	}
	var quickStart bool
	for _, s := range goSnippets(t, "README.md") {
		quickStart = quickStart || (s.complete() && strings.Contains(s.code, "package main") &&
			strings.Contains(s.code, `"github.com/netlock-go/netlock/goredis"`))
	}
	if !quickStart {
		t.Fatal("README.md has no quick start: a ```go block with package main that imports netlock/goredis")
	}

	dir := t.TempDir()
	writeSnippetModule(t, dir, root)
	var statements strings.Builder
	statements.WriteString("package snippets\n\nimport (\n")
	for _, im := range snippetImports {
		fmt.Fprintf(&statements, "\t%s %q\n", im.name, im.path)
	}
	statements.WriteString(")\n\nvar (\n")
	for _, im := range snippetImports {
		fmt.Fprintf(&statements, "\t_ = %s\n", im.use)
	}
	statements.WriteString(")\n")
	programs := 0
	for _, s := range all {
		if s.complete() {
			programs++
			writeFile(t, filepath.Join(dir, fmt.Sprintf("program%d", programs), "main.go"),
				fmt.Sprintf("//line %s:%d\n%s", s.file, s.line, s.code))
			continue
		}
		// A block of its own: a snippet may declare what another declares.
		fmt.Fprintf(&statements, "\nfunc _() error {\n\t{\n//line %s:%d\n%s\n\t}\n\treturn nil\n}\n", s.file, s.line, s.code)
	}
	writeFile(t, filepath.Join(dir, "snippets", "prelude.go"), snippetPrelude)
	writeFile(t, filepath.Join(dir, "snippets", "statements.go"), statements.String())

	env := append(os.Environ(),
		"GOWORK=off", "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=mod -buildvcs=false", "GOTOOLCHAIN=local")
	for _, args := range [][]string{
		{"build", "./..."},
		{"vet", "-unreachable=false", "./..."},
	} {
		cmd := exec.Command(goTool, args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s of the documents' Go snippets: %v\n%s\n(the modules they need come from the module cache, offline: "+
				"go mod download in . and otelnetlock/ fills it)", strings.Join(args, " "), err, out)
		}
	}
	t.Logf("%d snippets built, %d of them whole programs", len(all), programs)
}

// writeSnippetModule writes the go.mod and go.sum of a module that requires
// this checkout's netlock and otelnetlock, at the versions of their go.mod.
func writeSnippetModule(t *testing.T, dir, root string) {
	t.Helper()
	mod := readFile(t, filepath.Join(root, "go.mod"))
	mod = regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(mod, "module docsnippets")
	mod += fmt.Sprintf(`
require (
	github.com/netlock-go/netlock v0.0.0-00010101000000-000000000000
	github.com/netlock-go/netlock/otelnetlock v0.0.0-00010101000000-000000000000
)

replace github.com/netlock-go/netlock => %q

replace github.com/netlock-go/netlock/otelnetlock => %q
`, root, filepath.Join(root, "otelnetlock"))
	writeFile(t, filepath.Join(dir, "go.mod"), mod)
	writeFile(t, filepath.Join(dir, "go.sum"),
		readFile(t, filepath.Join(root, "go.sum"))+readFile(t, filepath.Join(root, "otelnetlock", "go.sum")))
}

// TestREADMEShape holds the README to what a first reader needs: at most
// 250 lines, the install and test commands, and the test command the one
// CI runs.
func TestREADMEShape(t *testing.T) {
	readme := readFile(t, "README.md")
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250 (the depth goes in docs/)", n)
	}
	for _, want := range []string{
		"go get github.com/netlock-go/netlock",
		"go run ./cmd/netlock demo",
		"./test.sh -race",
		"go test",
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
	if ci := readFile(t, filepath.Join(".ci", "run")); !strings.Contains(ci, "./test.sh -race") {
		t.Error(".ci/run does not run the README's test command, ./test.sh -race")
	}
}

// TestDocLinks checks that every relative link of README.md and docs/*.md
// names a file or directory of the repository.
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	for _, f := range docFiles(t) {
		for i, line := range strings.Split(readFile(t, f), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
					t.Errorf("%s:%d: link to %s: %v", f, i+1, target, err)
				}
			}
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
