package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/outboxkit/outboxkit/examples/messaging-service/service"
)

// conformance checks every response the service gives in a test against
// the OpenAPI document it serves (kin-openapi): the status must be
// documented for the operation, and the body must match its media type and
// schema. A request to a path or method the document does not have must
// get the JSON error (404 or 405). The admin API under /admin/ is
// outbox/admin's and is not part of this document.
type conformance struct {
	doc    *openapi3.T
	router routers.Router

	mu       sync.Mutex
	failures []string
}

func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(service.OpenAPI())
	if err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI document: %v", err)
	}
	return doc
}

func newConformance(t *testing.T) *conformance {
	t.Helper()
	doc := loadDoc(t)
	doc.Servers = nil // the test server's random port, not the documented one
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &conformance{doc: doc, router: r}
}

// recorder keeps a copy of what the handler writes.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
	r.ResponseWriter.WriteHeader(s)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// wrap returns h with every response checked.
func (c *conformance) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, service.AdminPath) {
			h.ServeHTTP(w, r)
			return
		}
		// The request as the router sees it (its body is the handler's).
		probe := r.Clone(context.Background())
		probe.Body = http.NoBody
		rec := &recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		c.check(probe, rec)
	})
}

func (c *conformance) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = append(c.failures, fmt.Sprintf(format, args...))
}

func (c *conformance) check(req *http.Request, rec *recorder) {
	what := fmt.Sprintf("%s %s -> %d %.200s", req.Method, req.URL.RequestURI(), rec.status, rec.body.String())
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		// Not a documented operation: only the JSON 404 or 405 may answer.
		errSchema := c.doc.Components.Schemas["Error"].Value
		var v any
		if (rec.status != http.StatusNotFound && rec.status != http.StatusMethodNotAllowed) ||
			!strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") ||
			json.Unmarshal(rec.body.Bytes(), &v) != nil || errSchema.VisitJSON(v) != nil {
			c.fail("undocumented operation answered other than a JSON 404/405: %s", what)
		}
		return
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: rec.status,
		Header: rec.Header(),
		Body:   io.NopCloser(bytes.NewReader(rec.body.Bytes())),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true, // an undocumented status is a failure
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		c.fail("%s: %v", what, err)
	}
}

// report fails t with every response that did not match the document.
func (c *conformance) report(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.failures {
		t.Errorf("response does not match openapi.json: %s", f)
	}
}

// TestConformanceCatchesDrift: the check itself refuses what the document
// does not allow (an undocumented status, a body of the wrong type, a text
// answer on a JSON operation).
func TestConformanceCatchesDrift(t *testing.T) {
	t.Parallel()
	c := newConformance(t)
	bad := map[string]http.HandlerFunc{
		"undocumented status": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) },
		"wrong body": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status": 7}`)
		},
		"text on a JSON operation": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, "not found")
		},
	}
	for name, h := range bad {
		before := len(c.failures)
		srv := httptest.NewServer(c.wrap(h))
		res, err := http.Get(srv.URL + "/api/v1/outbound/messages/01ABC")
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		srv.Close()
		if len(c.failures) == before {
			t.Errorf("%s: not caught", name)
		}
	}
}
