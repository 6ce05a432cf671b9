// Package flowcatalysttest runs a fake FlowCatalyst platform for tests: an
// httptest server that speaks both generations of the batch API (the current
// {"items":[...]} one with per-item results, and seed 004's bare-array one),
// checks bearer tokens, serves an OAuth2 client-credentials token endpoint,
// records what it received, and can be told to fail requests or items.
//
//	srv := flowcatalysttest.NewServer()
//	defer srv.Close()
//	pub, _ := flowcatalyst.New(flowcatalyst.Config{BaseURL: srv.URL})
//	// ... publish ...
//	items := srv.Items(flowcatalyst.CurrentAPI.EventsPath)
//
// It is meant for tests only; its behaviour may change in minor releases.
package flowcatalysttest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
)

// Generation names the API generation of a request.
type Generation string

// The generations the server speaks.
const (
	// Current: {"items":[...]} answered by 201 {"results":[...]}.
	Current Generation = "current"
	// Seed: a bare array answered by 201 {"events"|"jobs":[...],"count":n}.
	Seed Generation = "seed"
)

// TokenPath is the path of the fake OAuth2 token endpoint.
const TokenPath = "/oauth/token"

// Request is one batch request the server received.
type Request struct {
	// Path is the URL path, e.g. "/api/events/batch".
	Path string
	// Generation is the request's API generation ("" when the body was
	// neither shape).
	Generation Generation
	// Items are the items of the body, as sent.
	Items []json.RawMessage
	// Authorization is the Authorization header.
	Authorization string
	// Body is the raw body.
	Body []byte
}

// Response overrides the server's answer to a request.
type Response struct {
	// Status is the HTTP status; 0 means 200.
	Status int
	// Header is added to the response.
	Header http.Header
	// Body is sent as is.
	Body []byte
	// Delay is waited before answering (or until the client goes away).
	Delay time.Duration
	// Continue, when true, makes the server wait Delay and then answer
	// normally (Status, Header and Body are ignored).
	Continue bool
}

// Server is a fake FlowCatalyst platform. Configure it before the code under
// test uses it; its methods are safe for concurrent use.
type Server struct {
	*httptest.Server

	mu           sync.Mutex
	staticToken  string
	clientID     string
	clientSecret string
	tokenTTL     time.Duration
	validTokens  map[string]bool
	tokenCalls   int
	onRequest    func(*Request) *Response
	onItem       func(r *Request, index int, item json.RawMessage) flowcatalyst.ItemResult
	requests     []Request
	accepted     map[string][]json.RawMessage
	nextID       int
}

// NewServer starts a fake FlowCatalyst. Close it when done.
func NewServer() *Server {
	s := &Server{validTokens: map[string]bool{}, accepted: map[string][]json.RawMessage{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// RequireToken makes every batch request need "Authorization: Bearer
// token" (or a token issued by the token endpoint).
func (s *Server) RequireToken(token string) {
	s.mu.Lock()
	s.staticToken = token
	s.mu.Unlock()
}

// EnableOAuth serves the client-credentials grant at TokenPath for the
// given client, issuing tokens with expires_in = ttl (whole seconds; 0
// omits expires_in), and makes batch requests need one of its tokens. It
// returns the token endpoint's URL.
func (s *Server) EnableOAuth(clientID, clientSecret string, ttl time.Duration) string {
	s.mu.Lock()
	s.clientID, s.clientSecret, s.tokenTTL = clientID, clientSecret, ttl
	s.mu.Unlock()
	return s.URL + TokenPath
}

// RevokeTokens makes every token issued so far invalid (batch requests
// carrying one get 401), as when tokens expire or are revoked.
func (s *Server) RevokeTokens() {
	s.mu.Lock()
	s.validTokens = map[string]bool{}
	s.mu.Unlock()
}

// TokenRequests returns how many token requests were answered with a token.
func (s *Server) TokenRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokenCalls
}

// OnRequest sets a hook called for every batch request (after the
// authorization check); a non-nil Response replaces the normal answer. Pass
// nil to remove it.
func (s *Server) OnRequest(f func(*Request) *Response) {
	s.mu.Lock()
	s.onRequest = f
	s.mu.Unlock()
}

// OnItem sets a hook that decides each item's result. A result with an
// empty Status means SUCCESS; an empty ID gets a generated one. In the seed
// generation, any result that is not SUCCESS or SKIPPED fails the whole
// request with HTTP 400 (the old API validated the batch as a whole).
func (s *Server) OnItem(f func(r *Request, index int, item json.RawMessage) flowcatalyst.ItemResult) {
	s.mu.Lock()
	s.onItem = f
	s.mu.Unlock()
}

// Requests returns the batch requests received so far, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Items returns the items stored at path (SUCCESS, or every item of a 2xx
// seed request), in the order they were stored.
func (s *Server) Items(path string) []json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]json.RawMessage(nil), s.accepted[path]...)
}

var (
	currentPaths = map[string]string{
		flowcatalyst.CurrentAPI.EventsPath:       "event",
		flowcatalyst.CurrentAPI.DispatchJobsPath: "job",
		flowcatalyst.CurrentAPI.AuditLogsPath:    "audit",
	}
	seedPaths = map[string]string{
		flowcatalyst.SeedAPI.EventsPath:       "events",
		flowcatalyst.SeedAPI.DispatchJobsPath: "jobs",
	}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, flowcatalyst.ErrorResponse{Error: code, Message: msg})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == TokenPath {
		s.serveToken(w, r)
		return
	}
	_, isCurrent := currentPaths[r.URL.Path]
	_, isSeed := seedPaths[r.URL.Path]
	if !isCurrent && !isSeed {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "no route for "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "use POST")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		return
	}
	req := &Request{Path: r.URL.Path, Authorization: r.Header.Get("Authorization"), Body: body}
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) > 0 && trimmed[0] == '[':
		if json.Unmarshal(trimmed, &req.Items) == nil {
			req.Generation = Seed
		}
	case len(trimmed) > 0 && trimmed[0] == '{':
		var env struct {
			Items []json.RawMessage `json:"items"`
		}
		if json.Unmarshal(trimmed, &env) == nil && env.Items != nil {
			req.Generation, req.Items = Current, env.Items
		}
	}

	s.mu.Lock()
	s.requests = append(s.requests, *req)
	authOK := s.authorized(req.Authorization)
	hook := s.onRequest
	s.mu.Unlock()

	if !authOK {
		writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "missing or invalid bearer token")
		return
	}
	if hook != nil {
		if resp := hook(req); resp != nil {
			if resp.Delay > 0 {
				t := time.NewTimer(resp.Delay)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				}
			}
			if !resp.Continue {
				for k, vs := range resp.Header {
					for _, v := range vs {
						w.Header().Add(k, v)
					}
				}
				w.WriteHeader(cmpStatus(resp.Status))
				_, _ = w.Write(resp.Body)
				return
			}
		}
	}
	switch {
	case req.Generation == Current && isCurrent:
		s.serveCurrent(w, req)
	case req.Generation == Seed && isSeed:
		s.serveSeed(w, req)
	default:
		writeError(w, http.StatusBadRequest, "VALIDATION_ERROR", "the body does not match the endpoint's API generation")
	}
}

func cmpStatus(s int) int {
	if s == 0 {
		return http.StatusOK
	}
	return s
}

func (s *Server) authorized(h string) bool {
	if s.staticToken == "" && s.clientID == "" {
		return true
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return false
	}
	return (s.staticToken != "" && tok == s.staticToken) || s.validTokens[tok]
}

func (s *Server) itemResults(req *Request) []flowcatalyst.ItemResult {
	s.mu.Lock()
	hook := s.onItem
	s.mu.Unlock()
	out := make([]flowcatalyst.ItemResult, len(req.Items))
	for i, it := range req.Items {
		var r flowcatalyst.ItemResult
		if hook != nil {
			r = hook(req, i, it)
		}
		if r.Status == "" {
			r.Status = flowcatalyst.ItemSuccess
		}
		out[i] = r
	}
	prefix := currentPaths[req.Path]
	if req.Generation == Seed {
		prefix = seedPaths[req.Path]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range out {
		if out[i].ID == "" && out[i].Status.Sent() {
			s.nextID++
			out[i].ID = fmt.Sprintf("%s_%06d", prefix, s.nextID)
		}
	}
	return out
}

func (s *Server) serveCurrent(w http.ResponseWriter, req *Request) {
	if len(req.Items) > flowcatalyst.CurrentAPI.MaxBatchSize {
		writeError(w, http.StatusBadRequest, "BATCH_TOO_LARGE", fmt.Sprintf("at most %d items", flowcatalyst.CurrentAPI.MaxBatchSize))
		return
	}
	results := s.itemResults(req)
	s.mu.Lock()
	for i, r := range results {
		if r.Status == flowcatalyst.ItemSuccess {
			s.accepted[req.Path] = append(s.accepted[req.Path], req.Items[i])
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, flowcatalyst.BatchResponse{Results: results})
}

func (s *Server) serveSeed(w http.ResponseWriter, req *Request) {
	if len(req.Items) == 0 {
		writeError(w, http.StatusBadRequest, "VALIDATION_ERROR", "the batch is empty")
		return
	}
	if len(req.Items) > flowcatalyst.SeedAPI.MaxBatchSize {
		writeError(w, http.StatusBadRequest, "VALIDATION_ERROR", fmt.Sprintf("at most %d items", flowcatalyst.SeedAPI.MaxBatchSize))
		return
	}
	results := s.itemResults(req)
	for i, r := range results {
		if !r.Status.Sent() {
			writeError(w, http.StatusBadRequest, "VALIDATION_ERROR", fmt.Sprintf("item %d: %s", i, r.Error))
			return
		}
	}
	key := seedPaths[req.Path]
	created := make([]map[string]string, len(results))
	s.mu.Lock()
	for i, r := range results {
		s.accepted[req.Path] = append(s.accepted[req.Path], req.Items[i])
		created[i] = map[string]string{"id": r.ID}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{key: created, "count": len(created)})
}

func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	clientID, secret, ttl := s.clientID, s.clientSecret, s.tokenTTL
	s.mu.Unlock()
	if clientID == "" {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "OAuth is not enabled")
		return
	}
	if r.Method != http.MethodPost || r.ParseForm() != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	if r.PostForm.Get("grant_type") != "client_credentials" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unsupported_grant_type"})
		return
	}
	id, sec, ok := r.BasicAuth()
	if !ok {
		id, sec = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if id != clientID || sec != secret {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_client", "error_description": "client authentication failed"})
		return
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	tok := "fc-" + hex.EncodeToString(b[:])
	s.mu.Lock()
	s.validTokens[tok] = true
	s.tokenCalls++
	s.mu.Unlock()
	resp := map[string]any{"access_token": tok, "token_type": "Bearer"}
	if ttl > 0 {
		resp["expires_in"] = int(ttl / time.Second)
	}
	writeJSON(w, http.StatusOK, resp)
}
