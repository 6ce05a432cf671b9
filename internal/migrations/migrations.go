// Package migrations reads a store's embedded, versioned migration files
// (NNN_name.up.sql and NNN_name.down.sql) for the database/sql stores.
package migrations

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema version: its up and down script in the store's
// own language, SQL for the SQL stores and mongosh commands for
// store/mongo (which builds its migrations in code rather than loading
// them with Load).
type Migration struct {
	Version  int
	Name     string
	Up, Down string
}

// Load reads the *.sql files in dir of fsys, ordered by version. Every
// version needs both its up and its down file.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	files, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, f := range files {
		base := path.Base(f)
		num, rest, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("migration %s: no version prefix", base)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: bad version %q", base, num)
		}
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v}
			byVersion[v] = m
		}
		var name string
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			name = strings.TrimSuffix(rest, ".up.sql")
			if m.Up != "" {
				return nil, fmt.Errorf("migration %s: version %d has two up files", base, v)
			}
			m.Up = string(b)
		case strings.HasSuffix(rest, ".down.sql"):
			name = strings.TrimSuffix(rest, ".down.sql")
			if m.Down != "" {
				return nil, fmt.Errorf("migration %s: version %d has two down files", base, v)
			}
			m.Down = string(b)
		default:
			return nil, fmt.Errorf("migration %s: neither .up.sql nor .down.sql", base)
		}
		// Two migrations numbered alike would run as one version: the
		// second's statements never (the version is recorded as applied).
		if m.Name != "" && m.Name != name {
			return nil, fmt.Errorf("migration %s: version %d is also %q", base, v, m.Name)
		}
		m.Name = name
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %d lacks its up or down file", m.Version)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
