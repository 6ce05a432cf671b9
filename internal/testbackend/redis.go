package testbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisAddr returns the address of the test Redis: OUTBOXKIT_REDIS_ADDR, else
// 127.0.0.1:6379 when it answers. When neither works t is skipped (or fails
// when backends are required).
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr, why := LookupOrStart("OUTBOXKIT_REDIS_ADDR", "127.0.0.1:6379", "127.0.0.1:6379", RedisContainer)
	if addr == "" {
		Unavailable(t, "Redis", why)
	}
	return addr
}

// Redis returns a client of the test Redis that answered PING, and a key
// prefix unique to t. Tests must put every key under the prefix: the server
// is shared with other tests running at the same time. Keys under the prefix
// are deleted and the client closed when t ends.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	addr := RedisAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		Unavailable(t, "Redis", "PING "+addr+": "+err.Error())
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "outboxkit-test:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			_ = c.Del(ctx, keys...).Err()
		}
		_ = c.Close()
	})
	return c, prefix
}
