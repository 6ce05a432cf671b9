package postgres

import "strings"

// logSQL holds the append-only path's statements, rendered once for the
// store's tables.
type logSQL struct {
	logCandidates, logTake, logBackstop string
	logLockGroups, logRuns, logWrite    string
	logExpired, logRecover              string
}

// marks, groups and the state view of the append-only path (migration 13).
func (s *Store) marksTable() string { return s.schema + "." + s.prefix + "marks" }
func (s *Store) groupsTable() string { return s.schema + "." + s.prefix + "groups" }
func (s *Store) stateView() string   { return s.schema + "." + s.prefix + "message_state" }

func buildLogSQL(s *Store) logSQL {
	r := strings.NewReplacer("{T}", s.messages, "{K}", s.marksTable(), "{G}", s.groupsTable(), "{P}", s.pauses,
		"{A}", s.attempts, "{CLAIMED}", claimedCols())
	q := r.Replace
	return logSQL{
		logCandidates: q(logCandidates),
		logTake:       q(logTake),
		logBackstop:   q(logBackstop),
		logLockGroups: q(logLockGroups),
		logRuns:       q(logRuns),
		logWrite:      q(logWrite),
		logExpired:    q(logExpired),
		logRecover:    q(logRecover),
	}
}

// enableLogMode switches the store to the append-only path (issue #28):
// claims and outcomes write marks, and reads see messages through the
// state view. It is not an option yet: the path does not cover every
// operation, and only tests turn it on.
func (s *Store) enableLogMode() {
	s.logMode = true
	s.lsql = buildLogSQL(s)
	s.lread = buildSQL(&Store{opts: s.opts, messages: s.stateView(), attempts: s.attempts, pauses: s.pauses})
}

// reads returns the read statements: over the state view on the
// append-only path, over the messages table otherwise.
func (s *Store) reads() *sqlText {
	if s.logMode {
		return &s.lread
	}
	return &s.sql
}
