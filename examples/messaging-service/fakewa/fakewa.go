// Package fakewa is a fake WhatsApp Cloud API for local runs and tests. It
// answers POST /{version}/{phone-number-id}/messages like the Graph API
// (a wamid per accepted message, Meta's error body otherwise), then posts
// signed status notifications (sent, delivered, read) to the service's
// webhook, as Meta does, redelivering with backoff when the webhook does
// not answer 200.
package fakewa

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/whatsapp"
)

// Phone is one business phone number of the fake.
type Phone struct {
	// AccessToken is the bearer token sends must carry.
	AccessToken string
	// AppSecret signs the notifications posted for this number.
	AppSecret string
}

// Config configures a Server.
type Config struct {
	// Phones maps phone number IDs to their secrets.
	Phones map[string]Phone
	// WebhookURL receives the notifications. It can be set later with
	// SetWebhookURL.
	WebhookURL string
	// ReceiptDelay is the pause before each receipt. Defaults to 200 ms.
	ReceiptDelay time.Duration
	// Logger receives the fake's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Send is one send the fake accepted.
type Send struct {
	PhoneNumberID string
	WAMID         string
	To            string
	// CallbackData is biz_opaque_callback_data (the outbox message ID).
	CallbackData string
	Body         json.RawMessage
}

// Server is the fake Cloud API. Start it with Start; stop it with Close.
type Server struct {
	cfg    Config
	srv    *http.Server
	ln     net.Listener
	client *http.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	webhook  string
	n        int
	sends    []Send
	failures map[string]int // recipient -> Meta error code
	hold     chan struct{}  // non-nil: sends wait until it is closed
}

// Start listens on addr ("127.0.0.1:0" for any free port) and serves.
func Start(addr string, cfg Config) (*Server, error) {
	if cfg.ReceiptDelay == 0 {
		cfg.ReceiptDelay = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, ln: ln, ctx: ctx, cancel: cancel, webhook: cfg.WebhookURL,
		failures: map[string]int{}, client: &http.Client{Timeout: 10 * time.Second}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{version}/{phone}/messages", s.send)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the fake's base URL (the publisher's BaseURL).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// SetWebhookURL sets where notifications go.
func (s *Server) SetWebhookURL(u string) {
	s.mu.Lock()
	s.webhook = u
	s.mu.Unlock()
}

// FailRecipient makes every send to the phone number `to` ("+..." form)
// answer Meta's error code (e.g. 131026 undeliverable, permanent; 131000,
// retryable); code 0 removes the rule.
func (s *Server) FailRecipient(to string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == 0 {
		delete(s.failures, to)
		return
	}
	s.failures[to] = code
}

// Hold makes sends wait (after they arrived) until release is called.
func (s *Server) Hold() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.hold == ch {
				s.hold = nil
			}
			s.mu.Unlock()
			close(ch)
		})
	}
}

// Sends returns the accepted sends so far.
func (s *Server) Sends() []Send {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Send(nil), s.sends...)
}

// Close stops the server and the receipt deliveries.
func (s *Server) Close() error {
	s.cancel()
	err := s.srv.Close()
	s.wg.Wait()
	return err
}

func metaError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": fmt.Sprintf("(#%d) %s", code, msg), "type": "OAuthException", "code": code,
		"error_data": map[string]any{"messaging_product": "whatsapp", "details": msg}, "fbtrace_id": "FAKE"}})
}

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	phone := r.PathValue("phone")
	p, ok := s.cfg.Phones[phone]
	if !ok {
		metaError(w, http.StatusBadRequest, 100, "Unknown phone number ID")
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+p.AccessToken {
		metaError(w, http.StatusUnauthorized, 190, "Invalid OAuth access token")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		metaError(w, http.StatusBadRequest, 100, "Unreadable body")
		return
	}
	var req struct {
		MessagingProduct string `json:"messaging_product"`
		To               string `json:"to"`
		Type             string `json:"type"`
		CallbackData     string `json:"biz_opaque_callback_data"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.MessagingProduct != "whatsapp" || req.To == "" || req.Type == "" {
		metaError(w, http.StatusBadRequest, 131009, "Parameter value is not valid")
		return
	}
	s.mu.Lock()
	hold := s.hold
	code := s.failures[req.To]
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		}
	}
	if code != 0 {
		metaError(w, http.StatusBadRequest, code, "Fake failure for this recipient")
		return
	}
	s.mu.Lock()
	s.n++
	wamid := fmt.Sprintf("wamid.FAKE%08d", s.n)
	s.sends = append(s.sends, Send{PhoneNumberID: phone, WAMID: wamid, To: req.To, CallbackData: req.CallbackData, Body: body})
	s.mu.Unlock()
	digits := strings.TrimPrefix(req.To, "+")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"messaging_product": "whatsapp",
		"contacts": []any{map[string]string{"input": req.To, "wa_id": digits}},
		"messages": []any{map[string]string{"id": wamid}}})
	s.cfg.Logger.Info("fake WhatsApp API accepted a message", "wamid", wamid)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for _, st := range []string{"sent", "delivered", "read"} {
			if !s.sleep(s.cfg.ReceiptDelay) {
				return
			}
			n := StatusNotification(phone, wamid, st, digits, req.CallbackData, time.Now())
			if !s.deliver(phone, p.AppSecret, n) {
				return
			}
		}
	}()
}

func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// deliver posts a notification until the webhook answers 200 (Meta retries
// with backoff); it gives up after about a minute or when the fake closes.
func (s *Server) deliver(phone, secret string, body []byte) bool {
	wait := 100 * time.Millisecond
	for i := 0; i < 12; i++ {
		s.mu.Lock()
		u := s.webhook
		s.mu.Unlock()
		if u != "" {
			status, err := Post(s.ctx, s.client, u, body, secret)
			if err == nil && status == http.StatusOK {
				return true
			}
			s.cfg.Logger.Info("fake WhatsApp API: webhook did not accept a notification, retrying", "status", status, "err", err)
		}
		if !s.sleep(wait) {
			return false
		}
		wait = min(wait*2, 5*time.Second)
	}
	return false
}

// Post sends a signed notification body to a webhook URL and returns the
// HTTP status.
func Post(ctx context.Context, c *http.Client, url string, body []byte, appSecret string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Hub-Signature-256", whatsapp.Sign(body, appSecret))
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func notification(phone string, value map[string]any) []byte {
	value["messaging_product"] = "whatsapp"
	value["metadata"] = map[string]string{"display_phone_number": "15550000000", "phone_number_id": phone}
	b, _ := json.Marshal(map[string]any{"object": "whatsapp_business_account", "entry": []any{map[string]any{
		"id": "WABA-FAKE", "changes": []any{map[string]any{"field": "messages", "value": value}}}}})
	return b
}

// StatusNotification is Meta's status webhook body for one status.
func StatusNotification(phone, wamid, status, recipient, callbackData string, at time.Time) []byte {
	st := map[string]any{"id": wamid, "status": status, "timestamp": strconv.FormatInt(at.Unix(), 10), "recipient_id": recipient}
	if callbackData != "" {
		st["biz_opaque_callback_data"] = callbackData
	}
	return notification(phone, map[string]any{"statuses": []any{st}})
}

// InboundNotification is Meta's webhook body for a text a user sent.
func InboundNotification(phone, from, id, text string, at time.Time) []byte {
	return notification(phone, map[string]any{
		"contacts": []any{map[string]any{"profile": map[string]string{"name": "Fake User"}, "wa_id": from}},
		"messages": []any{map[string]any{"from": from, "id": id, "timestamp": strconv.FormatInt(at.Unix(), 10),
			"type": "text", "text": map[string]string{"body": text}}},
	})
}
