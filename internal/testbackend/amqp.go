package testbackend

import "testing"

// AMQPURL returns the URL of the test RabbitMQ: OUTBOXKIT_AMQP_URL, else
// amqp://guest:guest@127.0.0.1:5672/ when it answers. When neither works t
// is skipped (or fails when backends are required). Tests must declare their
// own uniquely named (auto-delete) exchanges and queues: the broker is shared
// with other tests running at the same time.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u, why := LookupOrStart("OUTBOXKIT_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "127.0.0.1:5672", RabbitMQContainer)
	if u == "" {
		Unavailable(t, "RabbitMQ", why)
	}
	return u
}
