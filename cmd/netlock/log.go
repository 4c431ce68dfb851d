package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
)

// A lineHandler is the slog.Handler that "run -v" gives the library: it
// writes each record as one line for a person reading stderr, the message
// (without the library's "netlock: "), the lock's name, and the other
// attributes in parentheses:
//
//	netlock run: lock lost: job1 (token 3, reason extend)
//
// Times are left out (the line is now), and so are records below level.
// A node is named by its address, an error as the command words errors.
// It writes each line with one Write.
type lineHandler struct {
	prefix string       // "netlock run: "
	w      io.Writer    // shared: the command's own messages go there too
	level  slog.Leveler // the lowest level written
	node   func(i int) string
	attrs  []slog.Attr // from WithAttrs, their keys qualified by group
	group  string      // from WithGroup: "g." or "g.h.", "" for none
}

func (h *lineHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.level.Level()
}

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var lock string
	var rest []string
	add := func(a slog.Attr) {
		switch a.Key {
		case "lock":
			lock = a.Value.String()
		default:
			rest = append(rest, h.attrText(a))
		}
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		if !a.Equal(slog.Attr{}) { // an empty Attr is ignored, by slog's rule
			a.Key = h.group + a.Key
			add(a)
		}
		return true
	})
	var b strings.Builder
	b.WriteString(h.prefix)
	b.WriteString(strings.TrimPrefix(r.Message, "netlock: "))
	if lock != "" {
		b.WriteString(": " + lock)
	}
	if len(rest) > 0 {
		b.WriteString(" (" + strings.Join(rest, ", ") + ")")
	}
	b.WriteString("\n")
	_, err := io.WriteString(h.w, b.String())
	return err
}

// attrText renders a as "key value": words for the key (maxmemory_policy
// is "maxmemory policy"), the node's address for a node index, an error's
// text as the command's messages have it.
func (h *lineHandler) attrText(a slog.Attr) string {
	key := strings.ReplaceAll(a.Key, "_", " ")
	v := a.Value.Resolve()
	switch {
	case a.Key == "node" && v.Kind() == slog.KindInt64 && h.node != nil:
		return key + " " + h.node(int(v.Int64()))
	case a.Key == "error":
		return key + " " + oneLineText(v.String())
	case v.Kind() == slog.KindGroup:
		var parts []string
		for _, g := range v.Group() {
			parts = append(parts, h.attrText(slog.Attr{Key: a.Key + "." + g.Key, Value: g.Value}))
		}
		return strings.Join(parts, ", ")
	}
	return key + " " + v.String()
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h2 := *h
	h2.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range attrs {
		if !a.Equal(slog.Attr{}) {
			a.Key = h.group + a.Key
			h2.attrs = append(h2.attrs, a)
		}
	}
	return &h2
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h2 := *h
	h2.group = h.group + name + "."
	return &h2
}

// nodeNamer names node i of c for a log line: its address.
func (c *conn) nodeNamer() func(i int) string {
	return func(i int) string {
		if i < 0 || i >= len(c.nodes) {
			return strconv.Itoa(i)
		}
		return c.nodes[i].name
	}
}
