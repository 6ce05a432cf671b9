package whatsapp

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// RunCleanup calls w.WindowCleanup every interval (default: hourly, as in
// the seed system) until ctx ends, logging failures. It returns when ctx
// ends. Stores that expire windows by themselves (redisstate.State) need no
// cleanup.
func RunCleanup(ctx context.Context, w WindowStore, interval time.Duration, clock outbox.Clock, logger *slog.Logger) {
	if interval <= 0 {
		interval = time.Hour
	}
	if clock == nil {
		clock = outbox.SystemClock
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := w.WindowCleanup(ctx, clock.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			logger.ErrorContext(ctx, "whatsapp: session window cleanup failed", "err", err)
		case n > 0:
			logger.InfoContext(ctx, "whatsapp: expired session windows deleted", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
