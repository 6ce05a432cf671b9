//go:build race

package sqlite_test

// raceEnabled: the race detector slows the pure-Go SQLite engine about a
// hundredfold, so the processor tier runs a smaller load under -race.
const raceEnabled = true
