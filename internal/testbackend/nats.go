package testbackend

import "testing"

// NATSURL returns the URL of the test NATS server with JetStream enabled:
// OUTBOXKIT_NATS_URL, else nats://127.0.0.1:4222 when it answers. When
// neither works t is skipped (or fails when backends are required). Tests
// must create their own uniquely named streams: the server is shared with
// other tests running at the same time.
func NATSURL(t testing.TB) string {
	t.Helper()
	u, why := LookupOrStart("OUTBOXKIT_NATS_URL", "nats://127.0.0.1:4222", "127.0.0.1:4222", NATSContainer)
	if u == "" {
		Unavailable(t, "NATS", why)
	}
	return u
}
