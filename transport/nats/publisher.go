package nats

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Defaults of Config.
const (
	DefaultAckTimeout  = 10 * time.Second
	DefaultMaxInFlight = 256
)

// Header names the Publisher sets on every message, besides
// jetstream.MsgIDHeader ("Nats-Msg-Id", the outbox message ID).
const (
	HeaderID          = "Outbox-Id"
	HeaderTenant      = "Outbox-Tenant" // set when the message has a tenant
	HeaderTopic       = "Outbox-Topic"
	HeaderGroup       = "Outbox-Group" // set when the message has a group
	HeaderContentType = "Content-Type" // the message's content type (application/json by default)
)

// JetStream is the part of jetstream.JetStream the Publisher uses; a
// jetstream.JetStream from jetstream.New satisfies it.
type JetStream interface {
	PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// Config configures a Publisher.
type Config struct {
	// JetStream publishes the messages. Required. Create it with
	// jetstream.New on a connection you own (and close); giving it
	// jetstream.WithPublishAsyncTimeout bounds how long the client tracks
	// an ack that never comes.
	JetStream JetStream
	// Subject returns the subject a message is published to. An error fails
	// the message permanently (code "subject"). Defaults to SubjectPrefix
	// followed by the message's Topic.
	Subject func(m *outbox.Message) (string, error)
	// SubjectPrefix is put before the Topic by the default Subject, e.g.
	// "outbox." publishes topic "orders" to "outbox.orders". Defaults to "".
	SubjectPrefix string
	// AckTimeout bounds the wait for one message's PubAck. Defaults to 10s.
	AckTimeout time.Duration
	// MaxInFlight is the most messages published and not yet acknowledged
	// at a time by one Publish call. Defaults to 256.
	MaxInFlight int
	// NoStreamIsPermanent makes a message whose subject no stream captures
	// fail permanently (it is dead-lettered at once). Defaults to false:
	// it is retried with backoff (code "no_stream"), since a missing stream
	// is usually a deployment that has not created it yet.
	NoStreamIsPermanent bool
}

// Publisher publishes outbox messages to NATS JetStream. It implements
// outbox.Publisher.
//
// # Messages
//
// Each message is published to the subject Config.Subject returns, with its
// Payload as the data. Its Headers are copied as they are (so a "Nats-*"
// header acts as a JetStream directive, e.g. Nats-TTL), then the Publisher
// sets Nats-Msg-Id to the message ID and HeaderID, HeaderTopic,
// HeaderTenant, HeaderGroup and HeaderContentType. Because Nats-Msg-Id is
// the outbox ID, a message published again after a crash or a lost ack is
// dropped by the stream as a duplicate when it arrives within the stream's
// duplicate window (StreamConfig.Duplicates, 2 minutes by default), which
// turns the outbox's at-least-once delivery into effectively-once for that
// window. A duplicate counts as sent; its ProviderMessageID is the
// original's.
//
// A message is sent once the stream acknowledges it: ProviderMessageID is
// "stream:sequence" and ProviderResponse the PubAck as JSON.
//
// # Outcomes
//
// Retryable: no stream captures the subject ("no_stream", see
// Config.NoStreamIsPermanent), no ack within AckTimeout ("timeout"), the
// connection closed or reconnecting ("connection"), a JetStream error other
// than a bad request ("js_<code>", e.g. a stream that is full). Permanent:
// the subject function fails or returns an invalid subject ("subject"), a
// header name NATS cannot carry ("header"), a message larger than the
// server's or the stream's limit ("too_large"), a JetStream bad request
// ("js_<code>"). When the client holds too many unacknowledged messages the
// message is deferred ("stalled", no attempt counted).
//
// # Ordered groups and batching
//
// A batch is published asynchronously: every unordered message and the first
// message of every ordered group go out at once (up to MaxInFlight), and
// their acks are awaited together; then the second message of every group
// that succeeded, and so on. So a group's messages reach the stream in order,
// one after the other, and at a group's first failure its later messages are
// not sent (outbox.ErrNotAttempted).
//
// # Cancellation
//
// When ctx ends, messages not yet sent get outbox.ErrNotAttempted joined
// with ctx.Err(); messages sent and not yet acknowledged get a retryable
// error wrapping ctx.Err() (the stream may have stored them; the retry is
// deduplicated).
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	js          JetStream
	subject     func(m *outbox.Message) (string, error)
	ackTimeout  time.Duration
	maxInFlight int
	noStreamErr bool
}

// New returns a Publisher, or an error naming the first invalid Config field.
func New(cfg Config) (*Publisher, error) {
	if cfg.JetStream == nil {
		return nil, errors.New("nats: Config.JetStream is required")
	}
	if cfg.AckTimeout < 0 {
		return nil, errors.New("nats: Config.AckTimeout must not be negative")
	}
	if cfg.MaxInFlight < 0 {
		return nil, errors.New("nats: Config.MaxInFlight must not be negative")
	}
	if cfg.Subject != nil && cfg.SubjectPrefix != "" {
		return nil, errors.New("nats: set Config.Subject or Config.SubjectPrefix, not both")
	}
	subject := cfg.Subject
	if subject == nil {
		prefix := cfg.SubjectPrefix
		subject = func(m *outbox.Message) (string, error) { return prefix + m.Topic, nil }
	}
	return &Publisher{
		js:          cfg.JetStream,
		subject:     subject,
		ackTimeout:  cmp.Or(cfg.AckTimeout, DefaultAckTimeout),
		maxInFlight: cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight),
		noStreamErr: cfg.NoStreamIsPermanent,
	}, nil
}

// Publish publishes msgs and returns one Result per message, in order. See
// Publisher for the outcomes, ordered groups and cancellation.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	return outbox.PublishWaves(ctx, msgs, p.maxInFlight, func(ctx context.Context, idx []int, out []outbox.Result) {
		p.publishChunk(ctx, msgs, idx, out)
	})
}

// publishChunk sends the messages at idx without waiting, then awaits their
// acks.
func (p *Publisher) publishChunk(ctx context.Context, msgs []outbox.Message, idx []int, out []outbox.Result) {
	futures := make([]jetstream.PubAckFuture, len(idx))
	for j, i := range idx {
		if err := ctx.Err(); err != nil {
			out[i].Err = errors.Join(outbox.ErrNotAttempted, err)
			continue
		}
		nm, err := p.message(&msgs[i])
		if err != nil {
			out[i].Err = err
			continue
		}
		f, err := p.js.PublishMsgAsync(nm)
		if err != nil {
			out[i].Err = p.classify(err, true)
			continue
		}
		futures[j] = f
	}
	timer := time.NewTimer(p.ackTimeout)
	defer timer.Stop()
	for j, i := range idx {
		f := futures[j]
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			out[i] = ackResult(ack)
		case err := <-f.Err():
			out[i].Err = p.classify(err, false)
		case <-ctx.Done():
			out[i].Err = &outbox.PublishError{Code: "canceled", Message: "the context ended before the ack", Err: ctx.Err()}
		case <-timer.C:
			out[i].Err = &outbox.PublishError{Code: "timeout", Message: "no ack within " + p.ackTimeout.String(), Err: jetstream.ErrAsyncPublishTimeout}
			// The timer fired once for the whole chunk: the remaining
			// futures get only what has already arrived.
			for j2 := j + 1; j2 < len(idx); j2++ {
				if futures[j2] == nil {
					continue
				}
				select {
				case ack := <-futures[j2].Ok():
					out[idx[j2]] = ackResult(ack)
				case err := <-futures[j2].Err():
					out[idx[j2]].Err = p.classify(err, false)
				default:
					out[idx[j2]].Err = &outbox.PublishError{Code: "timeout", Message: "no ack within " + p.ackTimeout.String(), Err: jetstream.ErrAsyncPublishTimeout}
				}
			}
			return
		}
	}
}

func ackResult(ack *jetstream.PubAck) outbox.Result {
	resp, _ := json.Marshal(ack)
	return outbox.Result{
		ProviderMessageID: ack.Stream + ":" + strconv.FormatUint(ack.Sequence, 10),
		ProviderResponse:  resp,
	}
}

// message builds the NATS message of m.
func (p *Publisher) message(m *outbox.Message) (*nats.Msg, error) {
	subj, err := p.subject(m)
	if err != nil {
		return nil, outbox.Permanent("subject", "no subject for the message: "+redact.Printable(err.Error(), 300))
	}
	if !validSubject(subj) {
		return nil, outbox.Permanent("subject", fmt.Sprintf("%q is not a valid subject to publish to", redact.Printable(subj, 100)))
	}
	h := make(nats.Header, len(m.Headers)+6)
	for k, v := range m.Headers {
		if !validHeaderName(k) {
			return nil, outbox.Permanent("header", fmt.Sprintf("header name %q cannot be sent over NATS", redact.Printable(k, 100)))
		}
		h[k] = []string{v}
	}
	h[jetstream.MsgIDHeader] = []string{m.ID}
	h[HeaderID] = []string{m.ID}
	h[HeaderTopic] = []string{m.Topic}
	if m.Tenant != "" {
		h[HeaderTenant] = []string{m.Tenant}
	}
	if m.Group != "" {
		h[HeaderGroup] = []string{m.Group}
	}
	h[HeaderContentType] = []string{m.EffectiveContentType()}
	return &nats.Msg{Subject: subj, Data: m.Payload, Header: h}, nil
}

// classify maps a publish or ack error to an outbox error. beforeSend is
// true when the client refused the message before sending it.
func (p *Publisher) classify(err error, beforeSend bool) error {
	msg := redact.Printable(err.Error(), 500)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
		m := "no stream captures the subject (or JetStream is unavailable)"
		if p.noStreamErr {
			return &outbox.PublishError{Code: "no_stream", Message: m, Permanent: true, Err: err}
		}
		return &outbox.PublishError{Code: "no_stream", Message: m, Err: err}
	case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return outbox.Defer(time.Second, "stalled", "too many messages awaiting an ack")
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout):
		return &outbox.PublishError{Code: "timeout", Message: msg, Err: err}
	case errors.Is(err, nats.ErrMaxPayload):
		return &outbox.PublishError{Code: "too_large", Message: msg, Permanent: true, Err: err}
	case errors.Is(err, nats.ErrBadSubject):
		return &outbox.PublishError{Code: "subject", Message: msg, Permanent: true, Err: err}
	case errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrStaleConnection) ||
		// The client wraps some of these with %s ("error creating async
		// reply handler: nats: connection closed").
		strings.Contains(err.Error(), nats.ErrConnectionClosed.Error()):
		return &outbox.PublishError{Code: "connection", Message: msg, Err: err}
	case errors.As(err, &apiErr):
		code := "js_" + strconv.Itoa(int(apiErr.ErrorCode))
		switch {
		case apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return &outbox.PublishError{Code: "too_large", Message: msg, Permanent: true, Err: err}
		case apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound:
			return p.classify(jetstream.ErrNoStreamResponse, beforeSend)
		case apiErr.Code == 400:
			return &outbox.PublishError{Code: code, Message: msg, Permanent: true, Err: err}
		default:
			return &outbox.PublishError{Code: code, Message: msg, Err: err}
		}
	default:
		return &outbox.PublishError{Code: "error", Message: msg, Err: err}
	}
}

// validSubject reports whether s is a subject one can publish to: non-empty
// dot-separated tokens, no wildcards, no whitespace.
func validSubject(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	return !strings.ContainsFunc(s, unicode.IsSpace)
}

// validHeaderName reports whether k can be a NATS header name (an HTTP-style
// token: printable ASCII without ':' or spaces).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}
