package main

import (
	"runtime/debug"
	"strings"
)

// version describes the build from its build information (ok false: the
// binary has none): the module version ("(devel)" when built from a
// checkout), the VCS revision and time when the build recorded them, and the
// Go version. For example:
//
//	netlock v1.2.0 (go1.26.0)
//	netlock (devel), revision 908507f1..., 2025-11-23T09:14:00Z, modified (go1.26.0)
func version(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "netlock: version unknown (built without module information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(unknown version)"
	}
	parts := []string{"netlock " + v}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		parts = append(parts, "revision "+rev)
		if t := settings["vcs.time"]; t != "" {
			parts = append(parts, t)
		}
		if settings["vcs.modified"] == "true" {
			parts = append(parts, "modified")
		}
	}
	s := strings.Join(parts, ", ")
	if bi.GoVersion != "" {
		s += " (" + bi.GoVersion + ")"
	}
	return s
}
