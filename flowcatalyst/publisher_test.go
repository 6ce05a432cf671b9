package flowcatalyst_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/flowcatalyst"
	"github.com/outboxkit/outboxkit/flowcatalyst/flowcatalysttest"
	"github.com/outboxkit/outboxkit/outbox"
)

func msg(topic, group string, n int) outbox.Message {
	return outbox.Message{
		ID: fmt.Sprintf("m%04d", n), Topic: topic, Group: group,
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"type":"order.created","data":{"group":%q}}`, n, group)),
	}
}

func newPublisher(t *testing.T, cfg flowcatalyst.Config) *flowcatalyst.Publisher {
	t.Helper()
	p, err := flowcatalyst.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func itemN(t *testing.T, raw json.RawMessage) int {
	t.Helper()
	var v struct{ N int }
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("item %s: %v", raw, err)
	}
	return v.N
}

func publishError(t *testing.T, err error) *outbox.PublishError {
	t.Helper()
	var pe *outbox.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *outbox.PublishError", err, err)
	}
	return pe
}

func TestPublishCurrentAPI(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL})

	msgs := []outbox.Message{
		msg(flowcatalyst.TopicEvent, "g1", 1),
		msg(flowcatalyst.TopicDispatchJob, "g1", 2),
		msg(flowcatalyst.TopicEvent, "g1", 3),
	}
	res := pub.Publish(context.Background(), msgs)
	if len(res) != len(msgs) {
		t.Fatalf("got %d results for %d messages", len(res), len(msgs))
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("result %d: %v", i, r.Err)
		}
		if r.ProviderMessageID == "" {
			t.Errorf("result %d has no provider message id", i)
		}
		if !json.Valid(r.ProviderResponse) {
			t.Errorf("result %d provider response %q is not JSON", i, r.ProviderResponse)
		}
	}
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want 2 (one per endpoint)", len(reqs))
	}
	if reqs[0].Path != "/api/events/batch" || reqs[1].Path != "/api/dispatch-jobs/batch" {
		t.Fatalf("paths = %s, %s", reqs[0].Path, reqs[1].Path)
	}
	for _, r := range reqs {
		if r.Generation != flowcatalysttest.Current {
			t.Errorf("%s: generation %q, want current ({\"items\":[...]})", r.Path, r.Generation)
		}
	}
	// Payloads are sent as the JSON they are: objects, not strings.
	want := `{"items":[` + string(msgs[0].Payload) + `,` + string(msgs[2].Payload) + `]}`
	if string(reqs[0].Body) != want {
		t.Errorf("events body\n got %s\nwant %s", reqs[0].Body, want)
	}
	if got := srv.Items("/api/events/batch"); len(got) != 2 || itemN(t, got[0]) != 1 || itemN(t, got[1]) != 3 {
		t.Errorf("stored events %s", got)
	}
}

func TestPublishSeedAPI(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: flowcatalyst.SeedAPI})

	msgs := []outbox.Message{msg(flowcatalyst.TopicDispatchJob, "", 1), msg(flowcatalyst.TopicDispatchJob, "", 2), msg(flowcatalyst.TopicEvent, "", 3)}
	for i, r := range pub.Publish(context.Background(), msgs) {
		if r.Err != nil {
			t.Fatalf("result %d: %v", i, r.Err)
		}
	}
	reqs := srv.Requests()
	if len(reqs) != 2 || reqs[0].Path != "/api/dispatch/jobs/batch" || reqs[1].Path != "/api/events/batch" {
		t.Fatalf("requests = %+v", reqs)
	}
	want := "[" + string(msgs[0].Payload) + "," + string(msgs[1].Payload) + "]"
	if string(reqs[0].Body) != want || reqs[0].Generation != flowcatalysttest.Seed {
		t.Errorf("body %s, want bare array %s", reqs[0].Body, want)
	}
}

func TestPublishSeedAPIAnySuccessStatus(t *testing.T) {
	t.Parallel()
	for _, status := range []int{200, 201, 202, 204} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			srv := flowcatalysttest.NewServer()
			defer srv.Close()
			srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
				return &flowcatalysttest.Response{Status: status, Body: []byte("not json at all")}
			})
			pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: flowcatalyst.SeedAPI})
			for i, r := range pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1), msg("EVENT", "", 2)}) {
				if r.Err != nil {
					t.Errorf("result %d: %v, want sent", i, r.Err)
				}
			}
		})
	}
}

func TestPublishItemStatuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status    flowcatalyst.ItemStatus
		sent      bool
		permanent bool
	}{
		{flowcatalyst.ItemSuccess, true, false},
		{flowcatalyst.ItemSkipped, true, false},
		{flowcatalyst.ItemBadRequest, false, true},
		{flowcatalyst.ItemForbidden, false, true},
		{flowcatalyst.ItemUnauthorized, false, false},
		{flowcatalyst.ItemInternalError, false, false},
		{flowcatalyst.ItemGatewayError, false, false},
		{"IN_PROGRESS", false, false},
		{"SOMETHING_NEW", false, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.status), func(t *testing.T) {
			t.Parallel()
			srv := flowcatalysttest.NewServer()
			defer srv.Close()
			srv.OnItem(func(_ *flowcatalysttest.Request, i int, _ json.RawMessage) flowcatalyst.ItemResult {
				if i == 1 {
					return flowcatalyst.ItemResult{ID: "evt_X", Status: tt.status, Error: "item detail"}
				}
				return flowcatalyst.ItemResult{}
			})
			pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL})
			res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1), msg("EVENT", "", 2), msg("EVENT", "", 3)})
			if res[0].Err != nil || res[2].Err != nil {
				t.Fatalf("neighbours failed: %v, %v", res[0].Err, res[2].Err)
			}
			r := res[1]
			if tt.sent {
				if r.Err != nil {
					t.Fatalf("err = %v, want sent", r.Err)
				}
				if r.ProviderMessageID != "evt_X" {
					t.Errorf("provider id = %q, want evt_X", r.ProviderMessageID)
				}
				return
			}
			pe := publishError(t, r.Err)
			if pe.Permanent != tt.permanent || outbox.IsRetryable(r.Err) == tt.permanent {
				t.Errorf("permanent = %v, want %v", pe.Permanent, tt.permanent)
			}
			if pe.Code != string(tt.status) {
				t.Errorf("code = %q, want %q", pe.Code, tt.status)
			}
			if !strings.Contains(pe.Message, "item detail") {
				t.Errorf("message %q lacks the server's error", pe.Message)
			}
		})
	}
}

func TestPublishPartialBatchOrderedGroup(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	// Item n=2 fails retryably in the first request. FlowCatalyst still
	// stores n=1 and n=3 (it processes every item); the Publisher reports
	// that, and does not send the group's next request (n=4, n=5).
	srv.OnItem(func(_ *flowcatalysttest.Request, _ int, item json.RawMessage) flowcatalyst.ItemResult {
		if bytes.Contains(item, []byte(`"n":2,`)) {
			return flowcatalyst.ItemResult{Status: flowcatalyst.ItemInternalError, Error: "db busy"}
		}
		return flowcatalyst.ItemResult{}
	})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 3})
	var msgs []outbox.Message
	for n := 1; n <= 5; n++ {
		msgs = append(msgs, msg("EVENT", "order-1", n))
	}
	msgs = append(msgs, msg("EVENT", "", 6), msg("EVENT", "order-2", 7))
	res := pub.Publish(context.Background(), msgs)

	if res[0].Err != nil || res[2].Err != nil {
		t.Fatalf("items 1 and 3 were stored, got errors %v, %v", res[0].Err, res[2].Err)
	}
	if pe := publishError(t, res[1].Err); pe.Permanent || pe.Code != "INTERNAL_ERROR" {
		t.Fatalf("item 2: %+v, want retryable INTERNAL_ERROR", pe)
	}
	for _, i := range []int{3, 4} {
		if !errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Errorf("item %d: %v, want ErrNotAttempted (its group has a retry pending)", i+1, res[i].Err)
		}
	}
	if res[5].Err != nil || res[6].Err != nil {
		t.Errorf("other groups: %v, %v, want sent", res[5].Err, res[6].Err)
	}
	var sent []int
	for _, it := range srv.Items("/api/events/batch") {
		sent = append(sent, itemN(t, it))
	}
	if fmt.Sprint(sent) != "[1 3 6 7]" {
		t.Errorf("stored items %v, want [1 3 6 7]", sent)
	}
}

func TestPublishPermanentItemDoesNotBlockGroup(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnItem(func(_ *flowcatalysttest.Request, _ int, item json.RawMessage) flowcatalyst.ItemResult {
		if bytes.Contains(item, []byte(`"n":1,`)) {
			return flowcatalyst.ItemResult{Status: flowcatalyst.ItemBadRequest, Error: "missing source"}
		}
		return flowcatalyst.ItemResult{}
	})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 1})
	res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "g", 1), msg("EVENT", "g", 2)})
	if pe := publishError(t, res[0].Err); !pe.Permanent {
		t.Fatalf("item 1: %v, want permanent", res[0].Err)
	}
	if res[1].Err != nil {
		t.Fatalf("item 2: %v: a dead-lettered message must not block its group", res[1].Err)
	}
}

func TestPublishHTTPStatuses(t *testing.T) {
	t.Parallel()
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		status     int
		retryAfter string
		permanent  bool
		minDelay   time.Duration
		maxDelay   time.Duration
	}{
		{status: 400, permanent: true},
		{status: 401},
		{status: 403, permanent: true},
		{status: 404},
		{status: 409},
		{status: 422},
		{status: 429},
		{status: 429, retryAfter: "7", minDelay: 7 * time.Second, maxDelay: 7 * time.Second},
		{status: 429, retryAfter: date, minDelay: 80 * time.Second, maxDelay: 90 * time.Second},
		{status: 429, retryAfter: "soon"},
		{status: 500},
		{status: 502},
		{status: 503, retryAfter: "30", minDelay: 30 * time.Second, maxDelay: 30 * time.Second},
		{status: 504},
		{status: 302},
	}
	for _, api := range []struct {
		name string
		api  flowcatalyst.API
	}{{"current", flowcatalyst.CurrentAPI}, {"seed", flowcatalyst.SeedAPI}} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%d/%s", api.name, tt.status, tt.retryAfter), func(t *testing.T) {
				t.Parallel()
				srv := flowcatalysttest.NewServer()
				defer srv.Close()
				srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
					h := http.Header{}
					if tt.retryAfter != "" {
						h.Set("Retry-After", tt.retryAfter)
					}
					return &flowcatalysttest.Response{Status: tt.status, Header: h, Body: []byte(`{"error":"SOME_CODE","message":"some explanation"}`)}
				})
				pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: api.api})
				res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1), msg("EVENT", "", 2)})
				for i, r := range res {
					pe := publishError(t, r.Err)
					if pe.Permanent != tt.permanent {
						t.Errorf("result %d permanent = %v, want %v (%v)", i, pe.Permanent, tt.permanent, r.Err)
					}
					if want := fmt.Sprintf("http_%d", tt.status); pe.Code != want {
						t.Errorf("code = %q, want %q", pe.Code, want)
					}
					if !strings.Contains(pe.Message, "SOME_CODE: some explanation") {
						t.Errorf("message %q lacks the error envelope", pe.Message)
					}
					d := outbox.RetryDelayOf(r.Err)
					if d < tt.minDelay || d > tt.maxDelay {
						t.Errorf("retry delay = %s, want between %s and %s", d, tt.minDelay, tt.maxDelay)
					}
				}
			})
		}
	}
}

func TestPublishSplitsBatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		api   flowcatalyst.API
		batch int
		n     int
		sizes string
	}{
		{"current default 1000", flowcatalyst.CurrentAPI, 0, 2300, "[1000 1000 300]"},
		{"current configured 100", flowcatalyst.CurrentAPI, 100, 250, "[100 100 50]"},
		{"seed default 100", flowcatalyst.SeedAPI, 0, 201, "[100 100 1]"},
		{"one at a time", flowcatalyst.SeedAPI, 1, 3, "[1 1 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := flowcatalysttest.NewServer()
			defer srv.Close()
			pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: tt.api, BatchSize: tt.batch})
			var msgs []outbox.Message
			for i := range tt.n {
				msgs = append(msgs, msg("DISPATCH_JOB", "g", i))
			}
			for i, r := range pub.Publish(context.Background(), msgs) {
				if r.Err != nil {
					t.Fatalf("result %d: %v", i, r.Err)
				}
			}
			var sizes []int
			for _, r := range srv.Requests() {
				sizes = append(sizes, len(r.Items))
			}
			if fmt.Sprint(sizes) != tt.sizes {
				t.Errorf("request sizes %v, want %s", sizes, tt.sizes)
			}
			stored := srv.Items(tt.api.DispatchJobsPath)
			if len(stored) != tt.n {
				t.Fatalf("stored %d items, want %d", len(stored), tt.n)
			}
			for i, it := range stored {
				if itemN(t, it) != i {
					t.Fatalf("item %d stored at position %d: order lost", itemN(t, it), i)
				}
			}
		})
	}
}

func TestPublishFailedRequestStopsGroup(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	calls := 0
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		calls++
		if calls == 1 {
			return &flowcatalysttest.Response{Status: 502}
		}
		return nil
	})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 2})
	msgs := []outbox.Message{msg("EVENT", "g", 1), msg("EVENT", "g", 2), msg("EVENT", "g", 3), msg("EVENT", "g", 4), msg("EVENT", "", 5)}
	res := pub.Publish(context.Background(), msgs)
	if pe := publishError(t, res[0].Err); pe.Permanent || pe.Code != "http_502" {
		t.Errorf("item 1: %v, want retryable http_502", res[0].Err)
	}
	// Item 2 was in the failed request, behind item 1 of its group: it is
	// not charged an attempt. Items 3 and 4 are not sent at all.
	for _, i := range []int{1, 2, 3} {
		if !errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Errorf("item %d: %v, want ErrNotAttempted", i+1, res[i].Err)
		}
	}
	if res[4].Err != nil {
		t.Errorf("unordered item: %v, want sent", res[4].Err)
	}
	if n := len(srv.Requests()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestPublishInvalidMessages(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: flowcatalyst.SeedAPI})
	bad := msg("EVENT", "", 2)
	bad.Payload = json.RawMessage(`{"unterminated"`)
	res := pub.Publish(context.Background(), []outbox.Message{
		msg("EVENT", "", 1), bad, msg("AUDIT_LOG", "", 3), msg("whatsapp", "", 4), msg("EVENT", "", 5),
	})
	for i, code := range []string{"", "invalid_payload", "unknown_topic", "unknown_topic", ""} {
		if code == "" {
			if res[i].Err != nil {
				t.Errorf("result %d: %v", i, res[i].Err)
			}
			continue
		}
		if pe := publishError(t, res[i].Err); !pe.Permanent || pe.Code != code {
			t.Errorf("result %d: %v, want permanent %s", i, res[i].Err, code)
		}
	}
	if reqs := srv.Requests(); len(reqs) != 1 || len(reqs[0].Items) != 2 {
		t.Errorf("requests %+v, want one with the 2 valid items", reqs)
	}
}

func TestPublishBadSuccessResponse(t *testing.T) {
	t.Parallel()
	bodies := map[string]string{
		"not json":        `<html>ok</html>`,
		"no results":      `{"events":[]}`,
		"results null":    `{"results":null}`,
		"too few results": `{"results":[{"id":"a","status":"SUCCESS"}]}`,
		"too many":        `{"results":[{"id":"a","status":"SUCCESS"},{"id":"b","status":"SUCCESS"},{"id":"c","status":"SUCCESS"}]}`,
		"no status":       `{"results":[{"id":"a"},{"id":"b","status":"SUCCESS"}]}`,
		"wrong type":      `{"results":[{"id":1,"status":"SUCCESS"},{"id":"b","status":"SUCCESS"}]}`,
		"empty":           ``,
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := flowcatalysttest.NewServer()
			defer srv.Close()
			srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
				return &flowcatalysttest.Response{Status: 201, Body: []byte(body)}
			})
			pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL})
			for i, r := range pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1), msg("EVENT", "", 2)}) {
				if pe := publishError(t, r.Err); pe.Permanent || pe.Code != "bad_response" {
					t.Errorf("result %d: %v, want retryable bad_response", i, r.Err)
				}
			}
		})
	}
}

func TestPublishResultsIfPresent(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	body := `{"jobs":[{"id":"a"}],"count":1}`
	srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
		if len(r.Items) == 2 {
			return &flowcatalysttest.Response{Status: 201, Body: []byte(`{"results":[{"id":"a","status":"SUCCESS"},{"id":"b","status":"BAD_REQUEST","error":"x"}]}`)}
		}
		return &flowcatalysttest.Response{Status: 201, Body: []byte(body)}
	})
	api := flowcatalyst.SeedAPI
	api.Results = flowcatalyst.ResultsIfPresent
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, API: api})
	res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1), msg("EVENT", "", 2)})
	if res[0].Err != nil || res[1].Err == nil {
		t.Errorf("with results: %v, %v; want sent, failed", res[0].Err, res[1].Err)
	}
	res = pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 3)})
	if res[0].Err != nil {
		t.Errorf("without results: %v, want sent", res[0].Err)
	}
}

func TestPublishTimeout(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Delay: 10 * time.Second, Continue: true}
	})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, RequestTimeout: 150 * time.Millisecond})
	start := time.Now()
	res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "g", 1)})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Publish took %s with a 150ms request timeout", d)
	}
	if pe := publishError(t, res[0].Err); pe.Permanent || pe.Code != "timeout" {
		t.Errorf("got %v, want retryable timeout", res[0].Err)
	}
}

func TestPublishHonoursContext(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL})

	t.Run("cancelled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res := pub.Publish(ctx, []outbox.Message{msg("EVENT", "", 1), msg("DISPATCH_JOB", "", 2)})
		for i, r := range res {
			if !errors.Is(r.Err, outbox.ErrNotAttempted) || !errors.Is(r.Err, context.Canceled) {
				t.Errorf("result %d: %v, want ErrNotAttempted and context.Canceled", i, r.Err)
			}
		}
		if n := len(srv.Requests()); n != 0 {
			t.Errorf("%d requests sent after cancel", n)
		}
	})
	t.Run("cancelled in flight", func(t *testing.T) {
		srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
			return &flowcatalysttest.Response{Delay: 10 * time.Second, Continue: true}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		res := pub.Publish(ctx, []outbox.Message{msg("EVENT", "", 1)})
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("Publish took %s after ctx ended", d)
		}
		if errors.Is(res[0].Err, outbox.ErrNotAttempted) || !outbox.IsRetryable(res[0].Err) {
			t.Errorf("got %v, want a retryable error counted as an attempt (the server may have the items)", res[0].Err)
		}
	})
}

func TestPublishTransportError(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	url := srv.URL
	srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: url})
	res := pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)})
	if pe := publishError(t, res[0].Err); pe.Permanent || pe.Code != "transport" {
		t.Errorf("got %v, want retryable transport", res[0].Err)
	}
}

func TestPublishBaseURLPrefix(t *testing.T) {
	t.Parallel()
	var got string
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Path
		w.WriteHeader(201)
	})
	srv.Config.Handler = mux
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL + "/fc/", API: flowcatalyst.SeedAPI})
	if r := pub.Publish(context.Background(), []outbox.Message{msg("DISPATCH_JOB", "", 1)}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	if got != "/fc/api/dispatch/jobs/batch" {
		t.Errorf("path %q", got)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	badAPI := flowcatalyst.CurrentAPI
	badAPI.EventsPath = "api/events"
	noBody := flowcatalyst.CurrentAPI
	noBody.Body = 0
	tests := []struct {
		name string
		cfg  flowcatalyst.Config
		want string
	}{
		{"no base url", flowcatalyst.Config{}, "BaseURL is required"},
		{"not http", flowcatalyst.Config{BaseURL: "ftp://x"}, "http(s) URL"},
		{"relative", flowcatalyst.Config{BaseURL: "flowcatalyst.local"}, "http(s) URL"},
		{"credentials", flowcatalyst.Config{BaseURL: "https://u:p@x"}, "credentials"},
		{"query", flowcatalyst.Config{BaseURL: "https://x/?a=1"}, "query"},
		{"batch too big current", flowcatalyst.Config{BaseURL: "https://x", BatchSize: 1001}, "between 1 and 1000"},
		{"batch too big seed", flowcatalyst.Config{BaseURL: "https://x", API: flowcatalyst.SeedAPI, BatchSize: 101}, "between 1 and 100"},
		{"negative batch", flowcatalyst.Config{BaseURL: "https://x", BatchSize: -1}, "BatchSize"},
		{"negative timeout", flowcatalyst.Config{BaseURL: "https://x", RequestTimeout: -1}, "timeouts"},
		{"bad path", flowcatalyst.Config{BaseURL: "https://x", API: badAPI}, "must start with /"},
		{"bad body", flowcatalyst.Config{BaseURL: "https://x", API: noBody}, "API.Body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := flowcatalyst.New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestAPIByName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"current": "/api/dispatch-jobs/batch", "": "/api/dispatch-jobs/batch", "SEED": "/api/dispatch/jobs/batch", "legacy": "/api/dispatch/jobs/batch"} {
		api, err := flowcatalyst.APIByName(name)
		if err != nil || api.DispatchJobsPath != want {
			t.Errorf("APIByName(%q) = %v, %v", name, api.DispatchJobsPath, err)
		}
	}
	if _, err := flowcatalyst.APIByName("v3"); err == nil {
		t.Error("APIByName(v3) succeeded")
	}
}

func TestPublishConcurrentUse(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 10})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var msgs []outbox.Message
			for i := range 25 {
				msgs = append(msgs, msg("EVENT", fmt.Sprint(g), g*100+i))
			}
			for _, r := range pub.Publish(context.Background(), msgs) {
				if r.Err != nil {
					t.Error(r.Err)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(srv.Items("/api/events/batch")); n != 200 {
		t.Errorf("stored %d items, want 200", n)
	}
}

// logBuffer collects every log line, at every level.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func TestTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-token-VALUE-123456"
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.RequireToken(secret)
	// A misbehaving server echoes the Authorization header everywhere.
	step := 0
	srv.OnRequest(func(r *flowcatalysttest.Request) *flowcatalysttest.Response {
		step++
		echo := r.Authorization
		switch step {
		case 1:
			return &flowcatalysttest.Response{Status: 400, Body: []byte(`{"error":"BAD","message":"bad header ` + echo + `"}`)}
		case 2:
			return &flowcatalysttest.Response{Status: 500, Body: []byte(`plain text ` + echo)}
		case 3:
			return &flowcatalysttest.Response{Status: 201, Body: []byte(`{"results":[{"id":"` + echo + `","status":"INTERNAL_ERROR","error":"` + echo + `"}]}`)}
		case 4:
			return &flowcatalysttest.Response{Status: 201, Body: []byte(`{"results":[{"id":"x","status":"` + echo + `","error":"e"}]}`)}
		case 5:
			return &flowcatalysttest.Response{Status: 201, Body: []byte(`{"results":"` + echo + `"}`)}
		}
		return nil
	})
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := flowcatalyst.Config{BaseURL: srv.URL, Token: flowcatalyst.StaticToken(secret), Logger: logger}
	pub := newPublisher(t, cfg)
	var seen []string
	for range 6 {
		for _, r := range pub.Publish(context.Background(), []outbox.Message{msg("EVENT", "", 1)}) {
			if r.Err != nil {
				seen = append(seen, r.Err.Error(), fmt.Sprintf("%+v", outbox.ErrorInfoOf(r.Err)))
			}
			seen = append(seen, r.ProviderMessageID, string(r.ProviderResponse))
		}
	}
	if len(srv.Requests()) != 6 {
		t.Fatalf("%d requests", len(srv.Requests()))
	}
	if got := srv.Requests()[5].Authorization; got != "Bearer "+secret {
		t.Fatalf("Authorization = %q", got)
	}
	seen = append(seen, logs.String(), fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg))
	for _, s := range seen {
		if strings.Contains(s, secret) || strings.Contains(s, secret[:12]) {
			t.Errorf("the token leaked into %q", s)
		}
	}
	if !strings.Contains(logs.String(), "flowcatalyst request") {
		t.Errorf("no debug log lines: %q", logs.String())
	}
}

func TestPublishFailedRequestChargesEveryItem(t *testing.T) {
	t.Parallel()
	srv := flowcatalysttest.NewServer()
	defer srv.Close()
	srv.OnRequest(func(*flowcatalysttest.Request) *flowcatalysttest.Response {
		return &flowcatalysttest.Response{Status: 503}
	})
	pub := newPublisher(t, flowcatalyst.Config{BaseURL: srv.URL, BatchSize: 2, ChargeEveryItem: true})
	msgs := []outbox.Message{msg("EVENT", "g", 1), msg("EVENT", "g", 2), msg("EVENT", "g", 3)}
	res := pub.Publish(context.Background(), msgs)
	// Both items of the failed request are charged, as in seed 004; the
	// group's item 3 is not sent after the failure.
	for _, i := range []int{0, 1} {
		if pe := publishError(t, res[i].Err); pe.Permanent || pe.Code != "http_503" || errors.Is(res[i].Err, outbox.ErrNotAttempted) {
			t.Errorf("item %d: %v, want a retryable http_503 charged to it", i+1, res[i].Err)
		}
	}
	if !errors.Is(res[2].Err, outbox.ErrNotAttempted) {
		t.Errorf("item 3: %v, want ErrNotAttempted", res[2].Err)
	}
}
