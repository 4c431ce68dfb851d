// Package fencesql shows fencing tokens checked by a SQL database: a row
// keeps the highest token written to it, and the statement that writes
// carries the condition (`WHERE fence_token <= $token`), so a holder that
// lost its lock while paused cannot overwrite a later holder's write. It
// is a test-only module of the netlock repository (see docs/fencing.md);
// its tests run on an embedded SQLite and miniredis.
package fencesql
