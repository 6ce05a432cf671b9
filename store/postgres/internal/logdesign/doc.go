// Package logdesign holds the parts of store/postgres's append-only design
// (../../LOG-DESIGN.md) that are written ahead of the store: the SQL that
// moves a store of today's schema onto the log design's tables with every
// message in its state, and the view that derives a message's status from
// them. Its test fills a real store with messages in every state through
// the store's own API, applies the SQL, and compares each message's derived
// status, attempts and group state with what the store says. The store does
// not use it yet.
package logdesign

import _ "embed"

// MigrateSQL creates the design's tables (marks, groups, finished, sent,
// receipts) beside today's messages table in schema {{schema}}, every name
// prefixed by {{prefix}} (Options.TablePrefix), fills them from the
// messages' states, and creates the status view.
//
//go:embed migrate.sql
var MigrateSQL string
