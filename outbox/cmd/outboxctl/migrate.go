package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

func cmdMigrate(ctx context.Context, args []string, e env) error {
	var action string
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var c conn
	c.register(fs)
	to := fs.Int("to", 0, "up: migrate up to this version (default the newest); down: revert down to this version (default one step; 0, every table with its data, only when said)")
	dry := fs.Bool("dry-run", false, "up, down: print the migrations that would run, change nothing")
	yes := fs.Bool("yes", false, "down --to 0: confirm removing every table (collection) and its data")
	down := fs.Bool("down", false, "sql: print the down migrations, newest first")
	if err := parse(fs, args, &action); err != nil {
		return err
	}
	allowed := map[string][]string{"up": {"to", "dry-run"}, "down": {"to", "dry-run", "yes"}, "status": nil, "sql": {"down"}}
	flags, ok := allowed[action]
	switch {
	case action == "":
		return usagef("migrate needs an action: up, down, status or sql")
	case !ok:
		return usagef("unknown migrate action %q (up, down, status, sql)", action)
	}
	if err := onlyFlags(fs, "migrate "+action, flags...); err != nil {
		return err
	}
	toSet := false
	fs.Visit(func(f *flag.Flag) { toSet = toSet || f.Name == "to" })
	if toSet && *to < 0 {
		return usagef("--to %d: a version is 0 or more", *to)
	}
	c.mode = map[string]openMode{"up": create, "down": inspect, "status": inspect, "sql": render}[action]
	t, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	if action == "sql" {
		return printSQL(e.out, t, c.prefix, *down)
	}
	newest := 0
	if n := len(t.migrations); n > 0 {
		newest = t.migrations[n-1].Version
	}
	v, err := t.migrator.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	switch action {
	case "status":
		fmt.Fprintf(e.out, "%s schema version %d (newest known: %d)\n", t.kind, v, newest)
		pending := 0
		for _, m := range t.migrations {
			state := "applied"
			if m.Version > v {
				state = "pending"
				pending++
			}
			fmt.Fprintf(e.out, "%03d_%s\t%s\n", m.Version, m.Name, state)
		}
		switch {
		case v == 0:
			return fmt.Errorf("%s: no outboxkit schema: %w", t.kind, errNotMigrated)
		case pending > 0:
			return fmt.Errorf("%s: %d of %d %w", t.kind, pending, len(t.migrations), errPending)
		}
		return nil
	case "up":
		target := newest
		if toSet {
			target = *to
		}
		switch {
		case target > newest:
			return usagef("--to %d: this outboxctl knows versions up to %d", target, newest)
		case target < v:
			return usagef("--to %d is below the schema version %d: that is migrate down", target, v)
		}
		return migrateTo(ctx, e, t, v, target, *dry)
	default: // down
		target := 0
		switch {
		case toSet && *to > v:
			return usagef("--to %d is above the schema version %d: that is migrate up", *to, v)
		case toSet:
			target = *to
		case v == 0:
			return fmt.Errorf("%s: no outboxkit schema to revert: %w", t.kind, errNotMigrated)
		default:
			// One step, as River's CLI does: the newest known migration
			// below the current version.
			for _, m := range t.migrations {
				if m.Version < v {
					target = m.Version
				}
			}
			if target == 0 {
				return usagef("migrate down from version %d removes every %s table with its data: say --to 0 to mean it", v, t.kind)
			}
		}
		if target == 0 && v > 0 && !*dry {
			if err := confirm(e, *yes, fmt.Sprintf("migrate down --to 0 removes every outboxkit table (collection) of %s %s with its data", t.kind, redact(c.url))); err != nil {
				return err
			}
		}
		return migrateTo(ctx, e, t, v, target, *dry)
	}
}

// migrateTo moves t's schema from version from to version to (or, on a dry
// run, prints what it would run) and prints the version reached.
func migrateTo(ctx context.Context, e env, t *target, from, to int, dry bool) error {
	verb, dir := "apply", "up"
	if to < from {
		verb, dir = "revert", "down"
	}
	for i := range t.migrations {
		m := t.migrations[i]
		if to < from {
			m = t.migrations[len(t.migrations)-1-i]
		}
		if (to > from && m.Version > from && m.Version <= to) || (to < from && m.Version <= from && m.Version > to) {
			if dry {
				fmt.Fprintf(e.out, "would %s %03d_%s (%s)\n", verb, m.Version, m.Name, dir)
			}
		}
	}
	if dry {
		fmt.Fprintf(e.out, "dry run: %s schema version stays %d\n", t.kind, from)
		return nil
	}
	if to != from {
		if err := t.migrator.MigrateTo(ctx, to); err != nil {
			return err
		}
	}
	v, err := t.migrator.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	newest := 0
	if n := len(t.migrations); n > 0 {
		newest = t.migrations[n-1].Version
	}
	fmt.Fprintf(e.out, "%s schema version %d (newest known: %d)\n", t.kind, v, newest)
	return nil
}

// printSQL prints the rendered migrations, ready for psql, mysql, sqlite3,
// mongosh or a migration tool. For MongoDB it adds the version records
// Migrate keeps, so a processor accepts a database set up by the script.
func printSQL(out io.Writer, t *target, prefix string, down bool) error {
	comment, ext := cmp.Or(t.comment, "--"), cmp.Or(t.ext, "sql")
	fmt.Fprintf(out, "%s outboxkit %s schema: %d migrations", comment, t.kind, len(t.migrations))
	if down {
		fmt.Fprint(out, " (down, newest first)")
	}
	versions := cmp.Or(prefix, "outbox_") + "migrations"
	if t.kind == "mongo" {
		fmt.Fprintf(out, ".\n// outboxctl migrate sql prints what Migrate applies, with its version records (%s).\n", versions)
		fmt.Fprint(out, "// MongoDB: mongosh commands for the database of the URL; run them with\n"+
			"// mongosh \"mongodb://host:27017/DB\" FILE.js\n")
	} else {
		fmt.Fprintf(out, ".\n%s outboxctl migrate sql prints what Migrate applies, without its version table.\n", comment)
	}
	fmt.Fprintln(out)
	if !down && t.preamble != "" {
		fmt.Fprint(out, t.preamble, "\n")
	}
	for i := range t.migrations {
		m := t.migrations[i]
		text, dir := m.Up, "up"
		if down {
			m = t.migrations[len(t.migrations)-1-i]
			text, dir = m.Down, "down"
		}
		text = strings.TrimRight(text, "\n") + "\n"
		if t.kind == "mongo" {
			text += mongoVersionRecord(versions, m, down)
		}
		fmt.Fprintf(out, "%s %03d_%s.%s.%s\n%s\n", comment, m.Version, m.Name, dir, ext, text)
	}
	if t.kind == "mongo" && down {
		fmt.Fprintf(out, "db.getCollection(%s).drop();\n", strconv.Quote(versions))
	}
	return nil
}

// mongoVersionRecord is the mongosh command that records (up) or removes
// (down) migration m in the versions collection, as Migrate does: a
// document {_id: version, name, applied_at}. The upsert keeps the script
// safe to run twice.
func mongoVersionRecord(versions string, m migration, down bool) string {
	if down {
		return fmt.Sprintf(`db.runCommand({"delete": %s, "deletes": [{"q": {"_id": %d}, "limit": 1}]});`+"\n",
			strconv.Quote(versions), m.Version)
	}
	return fmt.Sprintf(`db.runCommand({"update": %s, "updates": [{"q": {"_id": %d}, "u": {"$set": {"name": %s}, "$currentDate": {"applied_at": true}}, "upsert": true}]});`+"\n",
		strconv.Quote(versions), m.Version, strconv.Quote(m.Name))
}
