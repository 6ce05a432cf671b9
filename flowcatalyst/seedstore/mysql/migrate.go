package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
)

// CreateTables creates the two tables and their indexes, as seed 004
// defines them (see createTableSQL), when they do not exist yet.
func (s *Store) CreateTables(ctx context.Context) error {
	for _, t := range s.tables {
		ddl := strings.Replace(t.sql.ddl, "{IDX}", "`"+seedcore.IndexName(t.Raw)+"`", 1)
		if _, err := s.shared.DB.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("seedstore: create %s: %w", t.Raw, err)
		}
	}
	return nil
}
