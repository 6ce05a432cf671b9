package service

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/whatsapp"
)

// route is one documented endpoint; routes() registers exactly these, and
// the OpenAPI test compares them with openapi.json.
type route struct {
	method, path string
	auth         bool
	h            func(s *Service, w http.ResponseWriter, r *http.Request, org string)
}

// WebhookPath is where Meta (or the fake Cloud API) posts notifications.
// The organisation of a notification is the one its phone number ID
// belongs to; Meta's GET verification names it with the "tenant" query
// parameter or the X-Org-Id header.
const WebhookPath = "/api/v1/webhooks/whatsapp/inbound"

// OrgWebhookPath is one organisation's callback URL: WebhookPath followed
// by the organisation's ID, which Meta can call as is (its verification GET
// carries no header of ours). A notification posted there must be the
// organisation's own (403 otherwise).
func OrgWebhookPath(org string) string { return WebhookPath + "/" + url.PathEscape(org) }

var apiRoutes = []route{
	{"POST", "/api/v1/outbound/messages", true, (*Service).createMessage},
	{"GET", "/api/v1/outbound/messages", true, (*Service).listMessages},
	{"GET", "/api/v1/outbound/messages/paginated", true, (*Service).pageMessages},
	{"GET", "/api/v1/outbound/messages/{id}", true, (*Service).getMessage},
	{"POST", "/api/v1/outbound/messages/{id}/retry", true, (*Service).retryMessage},
	{"GET", "/api/v1/outbound/messages/{id}/audit-events", true, (*Service).messageAudit},
	{"GET", "/api/v1/outbound/messages/{id}/activities", true, (*Service).messageActivities},
	{"GET", "/api/v1/outbound/messages/{id}/attempts", true, (*Service).messageAttempts},
	{"GET", "/api/v1/outbound/stats", true, (*Service).stats},
	{"POST", "/api/v1/dossiers/{dossierId}/consents", true, (*Service).recordConsent},
	{"GET", "/api/v1/dossiers/{dossierId}/consents", true, (*Service).listConsents},
	{"GET", "/api/v1/dossiers/{dossierId}/audit-events", true, (*Service).dossierAudit},
	{"GET", "/api/v1/dossiers/{dossierId}/activities", true, (*Service).dossierActivities},
	{"GET", WebhookPath, false, nil},
	{"POST", WebhookPath, false, nil},
	{"GET", WebhookPath + "/{orgId}", false, nil},
	{"POST", WebhookPath + "/{orgId}", false, nil},
	{"GET", MetricsPath, false, (*Service).serveMetrics},
	{"GET", "/api/v1/openapi.json", false, func(_ *Service, w http.ResponseWriter, _ *http.Request, _ string) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	}},
	{"GET", "/healthz", false, func(_ *Service, w http.ResponseWriter, _ *http.Request, _ string) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}},
	{"GET", "/readyz", false, (*Service).readyz},
}

func (s *Service) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, rt := range apiRoutes {
		pattern := rt.method + " " + rt.path
		if rt.h == nil {
			mux.Handle(pattern, http.HandlerFunc(s.serveWebhook))
			continue
		}
		h := rt.h
		if !rt.auth {
			mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { h(s, w, r, "") })
			continue
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			org, ok := s.authenticate(w, r)
			if !ok {
				return
			}
			h(s, w, r, org)
		})
	}
	// Everything else answers the API's JSON error, not the mux's text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		for _, m := range []string{"GET", "POST"} {
			r2 := r.Clone(r.Context())
			r2.Method = m
			if _, p := mux.Handler(r2); p != "/" {
				writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method "+r.Method+" is not allowed here")
				return
			}
		}
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint")
	})
	return mux
}

// serveWebhook hands a request to the WhatsApp webhook. On an
// organisation's own URL (OrgWebhookPath) the organisation in the path is
// the request's X-Org-Id, whatever the header said: the GET verification
// checks that organisation's verify token, and a POST whose notification
// belongs to another organisation is refused (403).
func (s *Service) serveWebhook(w http.ResponseWriter, r *http.Request) {
	if org := r.PathValue("orgId"); org != "" {
		r = r.Clone(r.Context())
		r.Header.Set("X-Org-Id", org)
	}
	s.webhook.ServeHTTP(w, r)
}

// apiError is the error body of every failed API call.
type apiError struct {
	status        int
	code, message string
}

func (e *apiError) Error() string { return e.message }

func bad(code, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, code, fmt.Sprintf(format, args...)}
}

var errNotFound = &apiError{http.StatusNotFound, "not_found", "message not found"}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": message}})
}

// fail answers err: an *apiError as is, anything else as a 500 that hides
// the cause from the caller (it is logged).
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae.status, ae.code, ae.message)
		return
	}
	if r.Context().Err() != nil {
		writeError(w, http.StatusServiceUnavailable, "cancelled", "request cancelled")
		return
	}
	s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal", "internal error")
}

// authenticate checks the API key (Authorization: Bearer <key>) and that
// X-Org-Id names the key's organisation.
func (s *Service) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "missing API key (Authorization: Bearer <key>)")
		return "", false
	}
	org, err := s.orgOfKey(r.Context(), hashKey(key))
	if errors.Is(err, sql.ErrNoRows) {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "invalid API key")
		return "", false
	}
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	hdr := r.Header.Get("X-Org-Id")
	if hdr == "" {
		writeError(w, http.StatusBadRequest, "missing_org", "the X-Org-Id header is required")
		return "", false
	}
	if hdr != org {
		writeError(w, http.StatusForbidden, "org_mismatch", "X-Org-Id does not match the API key's organisation")
		return "", false
	}
	return org, true
}

// keyCacheTTL is how long a verified key hash is remembered, so most
// requests skip the key lookup; a key deleted from msgsvc_api_keys stops
// working within it.
const keyCacheTTL = time.Minute

type cachedKey struct {
	org     string
	expires time.Time
}

func (s *Service) orgOfKey(ctx context.Context, hash string) (string, error) {
	if v, ok := s.keys.Load(hash); ok && time.Now().Before(v.(cachedKey).expires) {
		return v.(cachedKey).org, nil
	}
	var org string
	err := s.db.QueryRowContext(ctx, s.d.rebind("SELECT org_id FROM msgsvc_api_keys WHERE key_hash = ?"), hash).Scan(&org)
	if err != nil {
		return "", err
	}
	s.keys.Store(hash, cachedKey{org: org, expires: time.Now().Add(keyCacheTTL)})
	return org, nil
}

func (s *Service) readyz(w http.ResponseWriter, r *http.Request, _ string) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if !s.ready.Load() {
		writeError(w, http.StatusServiceUnavailable, "not_ready", "starting or stopping")
		return
	}
	if _, err := s.store.MessageCount(ctx, outbox.MessageCountParams{Tenant: "\x01readyz"}); err != nil {
		writeError(w, http.StatusServiceUnavailable, "not_ready", "the store does not answer")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// Channels of the seed. Only WHATSAPP has a provider here.
var knownChannels = map[string]bool{"EMAIL": true, "SMS": true, "WHATSAPP": true, "PHONE": true}

// createRequest is the body of POST /api/v1/outbound/messages.
type createRequest struct {
	DossierID      *int64          `json:"dossierId"`
	Channel        string          `json:"channel"`
	To             string          `json:"to"`
	TemplateCode   string          `json:"templateCode"`
	Subject        string          `json:"subject"`
	PayloadJSON    json.RawMessage `json:"payloadJson"`
	IdempotencyKey string          `json:"idempotencyKey"`
}

// decodeBody reads a JSON body of at most limit bytes into v. It refuses
// a body that is not UTF-8: encoding/json would store each invalid byte as
// U+FFFD, and the caller would get back something it never sent.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", limit)}
		}
		return bad("invalid_body", "the body could not be read")
	}
	if !utf8.Valid(body) {
		return bad("invalid_json", "the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bad("invalid_json", "invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad("invalid_json", "invalid JSON body: more than one JSON value")
	}
	return nil
}

func validKey(k string) bool {
	if k == "" || len(k) > 255 || !utf8.ValidString(k) {
		return false
	}
	for _, r := range k {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// txKey carries the request's transaction to the consent policy, so the
// consent is read in the transaction that enqueues.
type txKey struct{}

func (s *Service) createMessage(w http.ResponseWriter, r *http.Request, org string) {
	var req createRequest
	if err := decodeBody(w, r, s.cfg.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	msg, meta, err := s.validateCreate(r, org, &req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var (
		res     []outbox.Enqueued
		blocked *outbox.PolicyError
		repeat  bool
	)
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		ctx := context.WithValue(r.Context(), txKey{}, tx)
		var err error
		res, err = s.ob.EnqueueTx(ctx, tx, msg)
		if errors.As(err, &blocked) {
			// Seed step 4: a repeated key returns the original message even
			// when consent was revoked since (checked here, off the happy
			// path, rather than before every insert).
			var n int
			if err := tx.QueryRowContext(ctx, s.d.rebind("SELECT COUNT(*) FROM msgsvc_messages WHERE org_id = ? AND idempotency_key = ?"),
				org, msg.IdempotencyKey).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				blocked, repeat = nil, true
				return nil
			}
			// Nothing was enqueued; the refusal is audited in this
			// transaction, against the dossier.
			return s.audit(ctx, tx, org, "DOSSIER", strconv.FormatInt(meta.DossierID, 10), "BLOCKED_BY_POLICY",
				"Outbound message blocked: "+blocked.Reason, time.Now())
		}
		if err != nil || res[0].Existed {
			return err
		}
		m := res[0].Message
		meta.ID, meta.CreatedAt = m.ID, m.CreatedAt
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO msgsvc_messages
			(id, org_id, idempotency_key, dossier_id, channel, to_recipient, template_code, subject, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			m.ID, org, m.IdempotencyKey, meta.DossierID, meta.Channel, meta.To, meta.TemplateCode, meta.Subject, micros(m.CreatedAt)); err != nil {
			return err
		}
		return s.audit(ctx, tx, org, "OUTBOUND_MESSAGE", m.ID, "CREATED",
			fmt.Sprintf("Outbound message created: channel=%s, to=%s, template=%s", meta.Channel, meta.To, meta.TemplateCode), m.CreatedAt)
	})
	switch {
	case err != nil:
		var ve *outbox.ValidationError
		if errors.As(err, &ve) {
			s.fail(w, r, bad("invalid_message", "%s %s", ve.Field, ve.Reason))
			return
		}
		s.fail(w, r, err)
	case blocked != nil:
		writeError(w, http.StatusUnprocessableEntity, blocked.Code, blocked.Reason)
	case repeat || res[0].Existed:
		// The key was used before (or by a concurrent request).
		v, err := s.byIdempotencyKey(r.Context(), org, msg.IdempotencyKey)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	default:
		s.log.Info("message QUEUED", "org", org, "id", res[0].Message.ID, "dossier", meta.DossierID)
		writeJSON(w, http.StatusCreated, view(res[0].Message, meta))
	}
}

func (s *Service) validateCreate(r *http.Request, org string, req *createRequest) (outbox.Message, messageMeta, error) {
	var zero outbox.Message
	ch := strings.ToUpper(req.Channel)
	switch {
	case req.Channel == "":
		return zero, messageMeta{}, bad("invalid_channel", "channel is required")
	case !knownChannels[ch]:
		return zero, messageMeta{}, bad("invalid_channel", "unknown channel %q (EMAIL, SMS, WHATSAPP, PHONE)", req.Channel)
	case ch != "WHATSAPP":
		return zero, messageMeta{}, bad("unsupported_channel", "channel %s has no provider in this service (only WHATSAPP)", ch)
	}
	if req.DossierID == nil || *req.DossierID <= 0 {
		return zero, messageMeta{}, bad("invalid_dossier", "dossierId is required (a positive integer): consent is recorded per dossier")
	}
	to, err := whatsapp.NormalizePhone(req.To)
	if err != nil || req.To == "" {
		return zero, messageMeta{}, bad("invalid_recipient", "to must be a phone number in international format (+ and country code)")
	}
	if req.TemplateCode != "" && (!validKey(req.TemplateCode) || len(req.TemplateCode) > 512) {
		return zero, messageMeta{}, bad("invalid_template", "templateCode is invalid")
	}
	if req.Subject != "" && (!validKey(req.Subject) || utf8.RuneCountInString(req.Subject) > maxSubject) {
		return zero, messageMeta{}, bad("invalid_subject", "subject must be at most %d characters without control characters", maxSubject)
	}
	var payload map[string]any
	if len(req.PayloadJSON) > 0 && string(req.PayloadJSON) != "null" {
		if err := json.Unmarshal(req.PayloadJSON, &payload); err != nil {
			return zero, messageMeta{}, bad("invalid_payload", "payloadJson must be a JSON object")
		}
	}
	body := map[string]any{"to": to}
	if req.TemplateCode != "" {
		body["templateCode"] = req.TemplateCode
		if payload != nil {
			body["payloadJson"] = payload
		}
	} else {
		text, _ := payload["body"].(string)
		if text == "" {
			return zero, messageMeta{}, bad("invalid_payload", "without templateCode, payloadJson.body (the text) is required")
		}
		body["body"] = text
	}
	key := r.Header.Get("Idempotency-Key")
	if key != "" && req.IdempotencyKey != "" && key != req.IdempotencyKey {
		return zero, messageMeta{}, bad("invalid_idempotency_key", "Idempotency-Key header and idempotencyKey differ")
	}
	key = cmpOr(key, req.IdempotencyKey)
	if key == "" {
		key = outbox.NewID(time.Now())
	}
	if !validKey(key) {
		return zero, messageMeta{}, bad("invalid_idempotency_key", "the idempotency key must be 1 to 255 bytes without control characters")
	}
	payloadBytes, err := json.Marshal(body)
	if err != nil {
		return zero, messageMeta{}, err
	}
	dossier := strconv.FormatInt(*req.DossierID, 10)
	m := outbox.Message{
		Tenant:         org,
		Topic:          Topic,
		IdempotencyKey: key,
		Payload:        payloadBytes,
		Headers:        map[string]string{"dossier-id": dossier, "channel": ch},
		MaxAttempts:    s.cfg.MaxAttempts,
	}
	return m, messageMeta{OrgID: org, DossierID: *req.DossierID, Channel: ch, To: to, TemplateCode: req.TemplateCode, Subject: req.Subject}, nil
}

// maxSubject is the longest subject, in characters.
const maxSubject = 255

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// consentPolicy refuses a message whose dossier has no GRANTED consent for
// its channel (the latest record wins). It runs inside outbox.EnqueueTx, in
// the request's transaction.
type consentPolicy struct{ s *Service }

func (p consentPolicy) Check(ctx context.Context, m *outbox.Message) error {
	dossier, err := strconv.ParseInt(m.Headers["dossier-id"], 10, 64)
	if err != nil {
		return &outbox.PolicyError{Code: "consent_required", Reason: "Consent required: the message names no dossier"}
	}
	channel := m.Headers["channel"]
	var q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	} = p.s.db
	if tx, ok := ctx.Value(txKey{}).(*sql.Tx); ok {
		q = tx
	}
	status, err := p.s.latestConsent(ctx, q, m.Tenant, dossier, channel)
	if err != nil {
		return err
	}
	if status != "GRANTED" {
		reason := "Consent required: No consent found for channel " + channel
		if status != "" {
			reason = "Consent required: consent for channel " + channel + " is " + status
		}
		return &outbox.PolicyError{Code: "consent_required", Reason: reason}
	}
	return nil
}

func (s *Service) latestConsent(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, org string, dossier int64, channel string) (string, error) {
	var status string
	err := q.QueryRowContext(ctx, s.d.rebind(`SELECT status FROM msgsvc_consents
		WHERE org_id = ? AND dossier_id = ? AND channel = ? ORDER BY id DESC LIMIT 1`), org, dossier, channel).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return status, err
}

func (s *Service) audit(ctx context.Context, tx *sql.Tx, org, entityType, entityID, action, details string, at time.Time) error {
	_, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO msgsvc_audit_events
		(org_id, entity_type, entity_id, action, details, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		org, entityType, entityID, action, details, micros(at))
	return err
}

// messageMeta is the service's row about a message (msgsvc_messages).
type messageMeta struct {
	ID           string
	OrgID        string
	DossierID    int64
	Channel      string
	To           string
	TemplateCode string
	Subject      string
	CreatedAt    time.Time
}

const metaCols = "id, org_id, dossier_id, channel, to_recipient, template_code, subject, created_at"

func scanMeta(sc interface{ Scan(...any) error }) (messageMeta, error) {
	var m messageMeta
	var created int64
	err := sc.Scan(&m.ID, &m.OrgID, &m.DossierID, &m.Channel, &m.To, &m.TemplateCode, &m.Subject, &created)
	m.CreatedAt = fromMicros(created)
	return m, err
}

func (s *Service) byIdempotencyKey(ctx context.Context, org, key string) (messageView, error) {
	meta, err := scanMeta(s.db.QueryRowContext(ctx, s.d.rebind("SELECT "+metaCols+" FROM msgsvc_messages WHERE org_id = ? AND idempotency_key = ?"), org, key))
	if errors.Is(err, sql.ErrNoRows) {
		return messageView{}, outbox.ErrNotFound
	}
	if err != nil {
		return messageView{}, err
	}
	return s.load(ctx, meta)
}

func (s *Service) load(ctx context.Context, meta messageMeta) (messageView, error) {
	m, err := s.store.MessageGet(ctx, outbox.MessageGetParams{Tenant: meta.OrgID, ID: meta.ID})
	if err != nil {
		return messageView{}, err
	}
	return view(m, meta), nil
}

// message returns one message of org, or errNotFound (also for another
// organisation's message: its existence is not revealed).
func (s *Service) message(ctx context.Context, org, id string) (messageView, error) {
	if !validKey(id) {
		return messageView{}, errNotFound
	}
	meta, err := scanMeta(s.db.QueryRowContext(ctx, s.d.rebind("SELECT "+metaCols+" FROM msgsvc_messages WHERE org_id = ? AND id = ?"), org, id))
	if errors.Is(err, sql.ErrNoRows) {
		return messageView{}, errNotFound
	}
	if err != nil {
		return messageView{}, err
	}
	v, err := s.load(ctx, meta)
	if errors.Is(err, outbox.ErrNotFound) {
		return messageView{}, errNotFound // pruned from the outbox
	}
	return v, err
}

func (s *Service) getMessage(w http.ResponseWriter, r *http.Request, org string) {
	v, err := s.message(r.Context(), org, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func dossierParam(v string) (int64, error) {
	if v == "" {
		return 0, bad("invalid_dossier", "dossierId is required")
	}
	d, err := strconv.ParseInt(v, 10, 64)
	if err != nil || d <= 0 {
		return 0, bad("invalid_dossier", "dossierId must be a positive integer")
	}
	return d, nil
}

// maxList caps GET /api/v1/outbound/messages?dossierId= (use the paginated
// endpoint for more).
const maxList = 500

func (s *Service) listMessages(w http.ResponseWriter, r *http.Request, org string) {
	d, err := dossierParam(r.URL.Query().Get("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.query(r.Context(), "SELECT "+metaCols+" FROM msgsvc_messages WHERE org_id = ? AND dossier_id = ? ORDER BY created_at DESC, id DESC LIMIT ?", org, d, maxList)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) query(ctx context.Context, q string, args ...any) ([]messageView, error) {
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, err
	}
	var metas []messageMeta
	for rows.Next() {
		m, err := scanMeta(rows)
		if err != nil {
			_ = rows.Close()
			return nil, err
		}
		metas = append(metas, m)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]messageView, 0, len(metas))
	for _, m := range metas {
		v, err := s.load(ctx, m)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Sort fields of the paginated listing and their columns.
var sortColumns = map[string]string{"createdAt": "created_at", "id": "id", "to": "to_recipient", "templateCode": "template_code"}

// MaxPageSize is the largest page of the paginated listing.
const MaxPageSize = 100

func (s *Service) pageMessages(w http.ResponseWriter, r *http.Request, org string) {
	q := r.URL.Query()
	d, err := dossierParam(q.Get("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, size := 0, 20
	if v := q.Get("page"); v != "" {
		if page, err = strconv.Atoi(v); err != nil || page < 0 || page > 1_000_000 {
			s.fail(w, r, bad("invalid_page", "page must be an integer >= 0"))
			return
		}
	}
	if v := q.Get("size"); v != "" {
		if size, err = strconv.Atoi(v); err != nil || size < 1 || size > MaxPageSize {
			s.fail(w, r, bad("invalid_size", "size must be between 1 and %d", MaxPageSize))
			return
		}
	}
	sortField := cmpOr(q.Get("sort"), "createdAt")
	col, ok := sortColumns[sortField]
	if !ok {
		s.fail(w, r, bad("invalid_sort", "unknown sort field %q (createdAt, id, to, templateCode)", sortField))
		return
	}
	dir := strings.ToUpper(cmpOr(q.Get("direction"), "DESC"))
	if dir != "ASC" && dir != "DESC" {
		s.fail(w, r, bad("invalid_direction", "direction must be ASC or DESC"))
		return
	}
	var total int64
	if err := s.db.QueryRowContext(r.Context(), s.d.rebind("SELECT COUNT(*) FROM msgsvc_messages WHERE org_id = ? AND dossier_id = ?"), org, d).Scan(&total); err != nil {
		s.fail(w, r, err)
		return
	}
	content, err := s.query(r.Context(), "SELECT "+metaCols+" FROM msgsvc_messages WHERE org_id = ? AND dossier_id = ? ORDER BY "+col+" "+dir+", id "+dir+" LIMIT ? OFFSET ?",
		org, d, size, page*size)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"content": content, "page": page, "size": size, "totalElements": total,
		"totalPages": (total + int64(size) - 1) / int64(size), "sort": sortField, "direction": dir,
	})
}

func (s *Service) retryMessage(w http.ResponseWriter, r *http.Request, org string) {
	v, err := s.message(r.Context(), org, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if v.Status != "FAILED" {
		writeError(w, http.StatusConflict, "invalid_status", "only a FAILED message can be retried; this one is "+v.Status)
		return
	}
	m, err := s.store.MessageRequeue(r.Context(), outbox.MessageRequeueParams{Tenant: org, ID: v.ID})
	if errors.Is(err, outbox.ErrInvalidTransition) {
		writeError(w, http.StatusConflict, "invalid_status", "the message is no longer FAILED")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.wake()
	s.log.Info("message QUEUED again by retry", "org", org, "id", m.ID)
	writeJSON(w, http.StatusOK, view(m, v.meta))
}

func (s *Service) stats(w http.ResponseWriter, r *http.Request, org string) {
	counts, err := s.store.MessageCount(r.Context(), outbox.MessageCountParams{Tenant: org})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by := map[string]int64{}
	for _, st := range outbox.Statuses() {
		by[apiStatus(st)] += counts[st]
	}
	rows, err := s.db.QueryContext(r.Context(), s.d.rebind(`SELECT attempts, COUNT(*) FROM `+s.d.outboxTable+`
		WHERE tenant = ? AND topic = ? AND status = 'FAILED' GROUP BY attempts ORDER BY attempts`), org, Topic)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rows.Close()
	type retryStat struct {
		AttemptCount int   `json:"attemptCount"`
		Count        int64 `json:"count"`
	}
	retries := []retryStat{}
	for rows.Next() {
		var rs retryStat
		if err := rows.Scan(&rs.AttemptCount, &rs.Count); err != nil {
			s.fail(w, r, err)
			return
		}
		retries = append(retries, rs)
	}
	if err := rows.Err(); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"orgId": org, "countsByStatus": by, "failedByAttemptCount": retries})
}

// Consent statuses.
var consentStatuses = map[string]bool{"GRANTED": true, "REVOKED": true, "PENDING": true}

func (s *Service) recordConsent(w http.ResponseWriter, r *http.Request, org string) {
	d, err := dossierParam(r.PathValue("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		Channel string `json:"channel"`
		Status  string `json:"status"`
	}
	if err := decodeBody(w, r, 4<<10, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ch, st := strings.ToUpper(req.Channel), strings.ToUpper(req.Status)
	if !knownChannels[ch] {
		s.fail(w, r, bad("invalid_channel", "unknown channel %q (EMAIL, SMS, WHATSAPP, PHONE)", req.Channel))
		return
	}
	if !consentStatuses[st] {
		s.fail(w, r, bad("invalid_status", "status must be GRANTED, REVOKED or PENDING"))
		return
	}
	now := time.Now().UTC()
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(r.Context(), s.d.rebind("INSERT INTO msgsvc_consents (org_id, dossier_id, channel, status, updated_at) VALUES (?, ?, ?, ?, ?)"),
			org, d, ch, st, micros(now)); err != nil {
			return err
		}
		return s.audit(r.Context(), tx, org, "DOSSIER", strconv.FormatInt(d, 10), "CONSENT_"+st, "Consent for channel "+ch+" set to "+st, now)
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, consentView{DossierID: d, Channel: ch, Status: st, UpdatedAt: now})
}

type consentView struct {
	DossierID int64     `json:"dossierId"`
	Channel   string    `json:"channel"`
	Status    string    `json:"status"`
	UpdatedAt time.Time `json:"updatedAt"`
}

func (s *Service) listConsents(w http.ResponseWriter, r *http.Request, org string) {
	d, err := dossierParam(r.PathValue("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rows, err := s.db.QueryContext(r.Context(), s.d.rebind("SELECT channel, status, updated_at FROM msgsvc_consents WHERE org_id = ? AND dossier_id = ? ORDER BY id DESC LIMIT 1000"), org, d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rows.Close()
	out := []consentView{}
	for rows.Next() {
		c := consentView{DossierID: d}
		var at int64
		if err := rows.Scan(&c.Channel, &c.Status, &at); err != nil {
			s.fail(w, r, err)
			return
		}
		c.UpdatedAt = fromMicros(at)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

type auditView struct {
	ID         int64     `json:"id"`
	OrgID      string    `json:"orgId"`
	EntityType string    `json:"entityType"`
	EntityID   string    `json:"entityId"`
	Action     string    `json:"action"`
	Details    string    `json:"details"`
	CreatedAt  time.Time `json:"createdAt"`
}

func (s *Service) auditList(w http.ResponseWriter, r *http.Request, org, entityType, entityID string) {
	rows, err := s.db.QueryContext(r.Context(), s.d.rebind(`SELECT id, org_id, entity_type, entity_id, action, details, created_at FROM msgsvc_audit_events
		WHERE org_id = ? AND entity_type = ? AND entity_id = ? ORDER BY id LIMIT 1000`), org, entityType, entityID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rows.Close()
	out := []auditView{}
	for rows.Next() {
		var a auditView
		var at int64
		if err := rows.Scan(&a.ID, &a.OrgID, &a.EntityType, &a.EntityID, &a.Action, &a.Details, &at); err != nil {
			s.fail(w, r, err)
			return
		}
		a.CreatedAt = fromMicros(at)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

type activityView struct {
	ID                int64           `json:"id"`
	DossierID         int64           `json:"dossierId"`
	OutboundMessageID string          `json:"outboundMessageId"`
	ActivityType      string          `json:"activityType"`
	Metadata          json.RawMessage `json:"metadata"`
	CreatedAt         time.Time       `json:"createdAt"`
}

func (s *Service) activityList(w http.ResponseWriter, r *http.Request, where string, args ...any) {
	rows, err := s.db.QueryContext(r.Context(), s.d.rebind(`SELECT id, dossier_id, message_id, activity_type, metadata, created_at FROM msgsvc_activities
		WHERE `+where+` ORDER BY id LIMIT 1000`), args...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rows.Close()
	out := []activityView{}
	for rows.Next() {
		var a activityView
		var at int64
		var meta string
		if err := rows.Scan(&a.ID, &a.DossierID, &a.OutboundMessageID, &a.ActivityType, &meta, &at); err != nil {
			s.fail(w, r, err)
			return
		}
		a.Metadata, a.CreatedAt = json.RawMessage(meta), fromMicros(at)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) messageAudit(w http.ResponseWriter, r *http.Request, org string) {
	v, err := s.message(r.Context(), org, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.auditList(w, r, org, "OUTBOUND_MESSAGE", v.ID)
}

func (s *Service) messageActivities(w http.ResponseWriter, r *http.Request, org string) {
	v, err := s.message(r.Context(), org, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.activityList(w, r, "org_id = ? AND message_id = ?", org, v.ID)
}

func (s *Service) messageAttempts(w http.ResponseWriter, r *http.Request, org string) {
	v, err := s.message(r.Context(), org, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	as, err := s.store.AttemptList(r.Context(), outbox.AttemptListParams{Tenant: org, MessageID: v.ID})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]attemptView, 0, len(as))
	for _, a := range as {
		out = append(out, viewAttempt(a))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) dossierAudit(w http.ResponseWriter, r *http.Request, org string) {
	d, err := dossierParam(r.PathValue("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.auditList(w, r, org, "DOSSIER", strconv.FormatInt(d, 10))
}

func (s *Service) dossierActivities(w http.ResponseWriter, r *http.Request, org string) {
	d, err := dossierParam(r.PathValue("dossierId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.activityList(w, r, "org_id = ? AND dossier_id = ?", org, d)
}
