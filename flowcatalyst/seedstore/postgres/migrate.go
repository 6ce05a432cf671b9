package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxkit/outboxkit/flowcatalyst/seedstore/internal/seedcore"
)

// createTableSQL is seed 004's table and index; {T} is the table, {IDX}
// the index.
const createTableSQL = `CREATE TABLE IF NOT EXISTS {T} (
    id VARCHAR(13) PRIMARY KEY,
    type VARCHAR(20) NOT NULL,
    message_group VARCHAR(255),
    payload TEXT NOT NULL,
    status VARCHAR(20) NOT NULL,
    retry_count INT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    processed_at TIMESTAMP,
    error_message TEXT
);
CREATE INDEX IF NOT EXISTS "{IDX}" ON {T}(status, message_group, created_at)`

// CreateTables creates the two tables and their indexes, as seed 004
// defines them, when they do not exist yet.
func (s *Store) CreateTables(ctx context.Context) error {
	for _, t := range s.tables {
		ddl := strings.NewReplacer("{T}", t.Name, "{IDX}", seedcore.IndexName(t.Raw)).Replace(createTableSQL)
		for _, stmt := range strings.Split(ddl, ";\n") {
			if _, err := s.shared.DB.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("seedstore: create %s: %w", t.Raw, err)
			}
		}
	}
	return nil
}
