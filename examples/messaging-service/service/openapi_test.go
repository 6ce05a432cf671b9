package service

import (
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/whatsapp"
)

// TestOpenAPIMatchesRoutes checks openapi.json against the mux: every
// documented operation reaches its own route (not the catch-all), and every
// route is documented.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	o := Org{ID: "org-1", APIKey: "0123456789abcdef0123"}
	o.WhatsApp = whatsapp.Credentials{PhoneNumberID: "1", AccessToken: "t", AppSecret: "s"}
	s, err := New(t.Context(), Config{DSN: filepath.Join(t.TempDir(), "o.db"), Orgs: []Org{o}, GraphBaseURL: "http://127.0.0.1:1",
		PollInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			m := strings.ToUpper(method)
			documented = append(documented, m+" "+path)
			concrete := strings.NewReplacer("{id}", "01ABC", "{dossierId}", "7").Replace(path)
			req := httptest.NewRequest(m, concrete, nil)
			if _, pattern := s.mux.Handler(req); pattern != m+" "+path {
				t.Errorf("documented %s %s is routed to %q", m, path, pattern)
			}
		}
	}
	var routed []string
	for _, r := range apiRoutes {
		routed = append(routed, r.method+" "+r.path)
	}
	slices.Sort(documented)
	slices.Sort(routed)
	if !slices.Equal(documented, routed) {
		t.Errorf("documented operations\n%v\nroutes\n%v", documented, routed)
	}
	// The served document is the embedded one.
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/openapi.json", nil))
	if rec.Code != 200 || rec.Body.String() != string(openAPI) || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("GET openapi.json: %d %s", rec.Code, rec.Header())
	}
}

func TestConfigFailsLoudly(t *testing.T) {
	t.Parallel()
	good := Org{ID: "org-1", APIKey: "0123456789abcdef0123", WhatsApp: whatsapp.Credentials{PhoneNumberID: "1", AccessToken: "t", AppSecret: "s"}}
	cases := map[string]Config{
		"no orgs":       {GraphBaseURL: "http://x"},
		"no graph url":  {Orgs: []Org{good}},
		"unknown store": {Store: "oracle", Orgs: []Org{good}, GraphBaseURL: "http://x"},
		"pg no dsn":     {Store: "postgres", Orgs: []Org{good}, GraphBaseURL: "http://x"},
		"short key":     {Orgs: []Org{{ID: "o", APIKey: "short", WhatsApp: good.WhatsApp}}, GraphBaseURL: "http://x"},
		"two keys":      {Orgs: []Org{{ID: "o", APIKey: good.APIKey, APIKeySHA256: hashKey("x"), WhatsApp: good.WhatsApp}}, GraphBaseURL: "http://x"},
		"dup org":       {Orgs: []Org{good, good}, GraphBaseURL: "http://x"},
		"no secret":     {Orgs: []Org{{ID: "o", APIKey: good.APIKey}}, GraphBaseURL: "http://x"},
		"bad schema":    {Store: "postgres", DSN: "postgres://x", PostgresSchema: "Bad-Name", Orgs: []Org{good}, GraphBaseURL: "http://x"},
		"short admin":   {Orgs: []Org{good}, GraphBaseURL: "http://x", AdminToken: "short-token"},
	}
	for name, c := range cases {
		c.DSN = cmpOr(c.DSN, filepath.Join(t.TempDir(), "c.db"))
		if s, err := New(t.Context(), c); err == nil {
			_ = s.Close()
			t.Errorf("%s: no error", name)
		} else if strings.Contains(err.Error(), good.APIKey) || strings.Contains(err.Error(), "short-token") {
			t.Errorf("%s: the error shows a secret: %v", name, err)
		}
	}
}
