package amqp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/internal/redact"
	"github.com/outboxkit/outboxkit/outbox"
)

// Defaults of Config.
const (
	DefaultConfirmTimeout = 10 * time.Second
	DefaultDialTimeout    = 10 * time.Second
	DefaultMaxInFlight    = 256
)

// Header names the Publisher adds to every message's headers table.
const (
	HeaderID     = "outbox-id"
	HeaderTenant = "outbox-tenant" // set when the message has a tenant
	HeaderTopic  = "outbox-topic"
	HeaderGroup  = "outbox-group" // set when the message has a group
)

// Config configures a Publisher.
type Config struct {
	// URL is the broker, e.g. "amqp://user:pass@rabbitmq:5672/vhost".
	// Required unless Dial is set. It never appears in errors.
	URL string
	// Dial opens a connection; it is called at the first Publish and again
	// after the connection is lost. Defaults to amqp.DialConfig(URL, ...)
	// with DialTimeout.
	Dial func(ctx context.Context) (*amqp.Connection, error)
	// DialTimeout bounds establishing a connection with the default Dial.
	// Defaults to 10s.
	DialTimeout time.Duration
	// Exchange is the exchange the default Route publishes to. Defaults to
	// "" (the default exchange, which routes by queue name).
	Exchange string
	// Route returns the exchange and routing key of a message. An error
	// fails the message permanently (code "route"). Defaults to Exchange
	// and the message's Topic.
	Route func(m *outbox.Message) (exchange, routingKey string, err error)
	// AllowUnroutable publishes without the mandatory flag: a message no
	// queue is bound for is dropped by the broker and counts as sent.
	// Defaults to false: messages are mandatory and an unroutable one fails
	// permanently (code "unroutable").
	AllowUnroutable bool
	// ConfirmTimeout bounds the wait for the broker's confirms of the
	// messages in flight. Defaults to 10s.
	ConfirmTimeout time.Duration
	// MaxInFlight is the most messages published and not yet confirmed at
	// a time. Defaults to 256.
	MaxInFlight int
}

// Publisher publishes outbox messages to RabbitMQ (AMQP 0-9-1) with
// publisher confirms. It implements outbox.Publisher.
//
// # Messages
//
// Each message is published to the exchange and routing key Config.Route
// returns, persistent (delivery mode 2), with content type
// application/json, message-id the outbox message ID, timestamp its
// creation time, and a headers table holding the message's Headers plus
// HeaderID, HeaderTopic, HeaderTenant and HeaderGroup. A message is sent
// once the broker confirms it (basic.ack); with a durable queue that means
// it is on disk. ProviderMessageID stays empty: AMQP gives a message no
// broker-side ID. Consumers should deduplicate by message-id, since the
// outbox delivers at least once.
//
// # Outcomes
//
// Permanent: an unroutable mandatory message ("unroutable"; the broker
// returned it: no queue is bound for its routing key), a Route error
// ("route"). Retryable: a nack ("nack"), no confirm within ConfirmTimeout
// ("timeout"), a missing exchange ("not_found": the broker closes the
// channel; a deployment that has not declared it yet should not lose
// messages), any other channel or connection error ("channel",
// "connection"). Error messages carry the broker's reply text, never the
// URL's credentials.
//
// # Connection
//
// The Publisher owns one connection and one confirm-mode channel, opened at
// the first Publish. A closed channel (the broker closes it on errors such
// as a missing exchange) is re-opened, and a lost connection re-dialled, at
// the next Publish. After a timeout or cancellation the channel is replaced,
// so late confirms of abandoned messages are never mistaken for new ones.
// Publish calls are serialized on the channel. Close releases both.
//
// # Ordered groups and batching
//
// Every unordered message and the first message of every ordered group are
// published at once (up to MaxInFlight) and their confirms awaited together;
// then the second message of every group that succeeded, and so on. A
// group's messages reach the exchange in order, and at a group's first
// failure its later messages are not sent (outbox.ErrNotAttempted).
//
// # Cancellation
//
// When ctx ends, messages not yet published get outbox.ErrNotAttempted
// joined with ctx.Err(); messages published and not yet confirmed get a
// retryable error wrapping ctx.Err() (the broker may have routed them).
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	dial           func(ctx context.Context) (*amqp.Connection, error)
	route          func(m *outbox.Message) (string, string, error)
	mandatory      bool
	confirmTimeout time.Duration
	maxInFlight    int
	secret         string // the URL's password, kept out of errors

	mu      sync.Mutex // held by Publish and Close
	closed  bool
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	chErr   chan *amqp.Error
	connErr chan *amqp.Error
}

// New returns a Publisher, or an error naming the first invalid Config
// field. It does not connect.
func New(cfg Config) (*Publisher, error) {
	if cfg.URL == "" && cfg.Dial == nil {
		return nil, errors.New("amqp: Config.URL (or Config.Dial) is required")
	}
	secret := ""
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
			return nil, errors.New("amqp: Config.URL must be an amqp:// or amqps:// URL")
		}
		secret, _ = u.User.Password()
	}
	if cfg.DialTimeout < 0 || cfg.ConfirmTimeout < 0 {
		return nil, errors.New("amqp: Config timeouts must not be negative")
	}
	if cfg.MaxInFlight < 0 {
		return nil, errors.New("amqp: Config.MaxInFlight must not be negative")
	}
	if cfg.Route != nil && cfg.Exchange != "" {
		return nil, errors.New("amqp: set Config.Route or Config.Exchange, not both")
	}
	dial := cfg.Dial
	if dial == nil {
		rawURL, timeout := cfg.URL, cmp.Or(cfg.DialTimeout, DefaultDialTimeout)
		dial = func(context.Context) (*amqp.Connection, error) {
			props := amqp.NewConnectionProperties()
			props.SetClientConnectionName("outboxkit")
			return amqp.DialConfig(rawURL, amqp.Config{Dial: amqp.DefaultDial(timeout), Properties: props})
		}
	}
	route := cfg.Route
	if route == nil {
		exchange := cfg.Exchange
		route = func(m *outbox.Message) (string, string, error) { return exchange, m.Topic, nil }
	}
	return &Publisher{
		dial:           dial,
		route:          route,
		mandatory:      !cfg.AllowUnroutable,
		confirmTimeout: cmp.Or(cfg.ConfirmTimeout, DefaultConfirmTimeout),
		maxInFlight:    cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight),
		secret:         secret,
	}, nil
}

// Close closes the channel and the connection. Publish after Close returns
// outbox.ErrNotAttempted joined with outbox.ErrClosed for every message.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.dropChannel()
	if p.conn != nil {
		err := p.conn.Close()
		p.conn = nil
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("amqp: closing the connection: %w", err)
		}
	}
	return nil
}

// Publish publishes msgs and returns one Result per message, in order. See
// Publisher for the outcomes, the connection, ordered groups and
// cancellation.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []outbox.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return outbox.PublishWaves(ctx, msgs, p.maxInFlight, func(ctx context.Context, idx []int, out []outbox.Result) {
		p.publishChunk(ctx, msgs, idx, out)
	})
}

// channel returns the open confirm-mode channel, opening it (and the
// connection) when needed. p.mu is held.
func (p *Publisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.closed {
		return nil, errors.Join(outbox.ErrNotAttempted, outbox.ErrClosed)
	}
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	p.dropChannel()
	if p.conn == nil || p.conn.IsClosed() {
		if p.conn != nil {
			_ = p.conn.Close()
			p.conn = nil
		}
		conn, err := p.dial(ctx)
		if err != nil {
			return nil, &outbox.PublishError{Code: "connection", Message: "connecting to the broker: " + p.describe(err), Err: err}
		}
		p.conn = conn
		p.connErr = conn.NotifyClose(make(chan *amqp.Error, 1))
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, p.classify(err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, p.classify(err)
	}
	p.ch = ch
	p.chErr = ch.NotifyClose(make(chan *amqp.Error, 1))
	p.returns = ch.NotifyReturn(make(chan amqp.Return, p.maxInFlight))
	return ch, nil
}

// dropChannel closes the current channel, if any. p.mu is held.
func (p *Publisher) dropChannel() {
	if p.ch != nil {
		_ = p.ch.Close()
	}
	p.ch, p.chErr, p.returns = nil, nil, nil
}

// publishChunk publishes the messages at idx, then awaits their confirms.
func (p *Publisher) publishChunk(ctx context.Context, msgs []outbox.Message, idx []int, out []outbox.Result) {
	if len(idx) == 0 {
		return
	}
	if err := ctx.Err(); err != nil {
		for _, i := range idx {
			out[i].Err = errors.Join(outbox.ErrNotAttempted, err)
		}
		return
	}
	ch, err := p.channel(ctx)
	if err != nil {
		for _, i := range idx {
			out[i].Err = err
		}
		return
	}
	p.drainReturns(nil) // returns of earlier calls, if any
	confirms := make([]*amqp.DeferredConfirmation, len(idx))
	for j, i := range idx {
		m := &msgs[i]
		if err := ctx.Err(); err != nil {
			out[i].Err = errors.Join(outbox.ErrNotAttempted, err)
			continue
		}
		exchange, key, err := p.route(m)
		if err != nil {
			out[i].Err = outbox.Permanent("route", "no route for the message: "+redact.Printable(err.Error(), 300))
			continue
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, p.mandatory, false, publishing(m))
		if err != nil {
			out[i].Err = p.classify(err)
			continue
		}
		confirms[j] = dc
	}

	timer := time.NewTimer(p.confirmTimeout)
	defer timer.Stop()
	abandoned := false
	for j, i := range idx {
		dc := confirms[j]
		if dc == nil {
			continue
		}
		if !abandoned {
			select {
			case <-dc.Done():
				continue
			case <-ctx.Done():
				abandoned = true
			case <-timer.C:
				abandoned = true
			}
		}
		select {
		case <-dc.Done():
		default:
			if ctx.Err() != nil {
				out[i].Err = &outbox.PublishError{Code: "canceled", Message: "the context ended before the confirm", Err: ctx.Err()}
			} else {
				out[i].Err = outbox.Retryable("timeout", "no confirm within "+p.confirmTimeout.String())
			}
		}
	}
	if abandoned {
		// Late confirms and returns of this chunk must not be read as
		// those of later messages: start afresh on a new channel.
		defer p.dropChannel()
	}
	returned := map[string]amqp.Return{}
	p.drainReturns(returned)
	var closeErr error
	for j, i := range idx {
		dc := confirms[j]
		if dc == nil || out[i].Err != nil {
			continue
		}
		switch {
		case !dc.Acked():
			if closeErr == nil {
				closeErr = p.closeReason()
			}
			if closeErr != nil {
				out[i].Err = closeErr
			} else {
				out[i].Err = outbox.Retryable("nack", "the broker refused the message (basic.nack)")
			}
		case returned[msgs[i].ID].ReplyCode != 0:
			r := returned[msgs[i].ID]
			out[i].Err = outbox.Permanent("unroutable", fmt.Sprintf("the broker returned the message: %d %s (exchange %q, routing key %q)",
				r.ReplyCode, redact.Printable(r.ReplyText, 200), redact.Printable(r.Exchange, 100), redact.Printable(r.RoutingKey, 100)))
		}
	}
}

// drainReturns reads the returned messages buffered so far into into (by
// message-id), or discards them when into is nil.
func (p *Publisher) drainReturns(into map[string]amqp.Return) {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			if into != nil {
				into[r.MessageId] = r
			}
		default:
			return
		}
	}
}

// closeReason returns the error that closed the channel or the connection,
// or nil when both are open.
func (p *Publisher) closeReason() error {
	var e *amqp.Error
	select {
	case e = <-p.chErr:
	default:
	}
	if e == nil {
		select {
		case e = <-p.connErr:
		default:
		}
	}
	if e == nil {
		if p.ch != nil && !p.ch.IsClosed() {
			return nil
		}
		e = amqp.ErrClosed
	}
	return p.classify(e)
}

func publishing(m *outbox.Message) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+4)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderID] = m.ID
	h[HeaderTopic] = m.Topic
	if m.Tenant != "" {
		h[HeaderTenant] = m.Tenant
	}
	if m.Group != "" {
		h[HeaderGroup] = m.Group
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  m.EffectiveContentType(),
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    m.CreatedAt,
		Body:         m.Payload,
	}
}

// classify maps a channel or connection error to an outbox error.
func (p *Publisher) classify(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		msg := fmt.Sprintf("%d %s", ae.Code, p.describe(errors.New(ae.Reason)))
		switch {
		case ae.Code == amqp.NotFound:
			return &outbox.PublishError{Code: "not_found", Message: msg, Err: err}
		case ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "larger than"):
			return &outbox.PublishError{Code: "too_large", Message: msg, Permanent: true, Err: err}
		case ae.Code == amqp.ChannelError || ae.Code == amqp.ConnectionForced || p.conn == nil || p.conn.IsClosed():
			return &outbox.PublishError{Code: "connection", Message: msg, Err: err}
		default:
			return &outbox.PublishError{Code: "channel", Message: msg, Err: err}
		}
	}
	return &outbox.PublishError{Code: "connection", Message: p.describe(err), Err: err}
}

// describe is err's text, short and printable, without the URL's password.
func (p *Publisher) describe(err error) string {
	s := err.Error()
	if len(p.secret) >= 3 {
		s = strings.ReplaceAll(s, p.secret, "[redacted]")
	}
	return redact.Printable(s, 300)
}
