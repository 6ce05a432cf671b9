package flowcatalyst

import (
	"fmt"
	"strings"
)

// Topics of the messages the Publisher sends. They are the seed's outbox
// item types (the "type" column of its tables).
const (
	// TopicEvent messages go to API.EventsPath.
	TopicEvent = "EVENT"
	// TopicDispatchJob messages go to API.DispatchJobsPath.
	TopicDispatchJob = "DISPATCH_JOB"
	// TopicAuditLog messages go to API.AuditLogsPath (current API only).
	TopicAuditLog = "AUDIT_LOG"
)

// Body is the shape of a batch request body.
type Body int

const (
	// BodyItems wraps the payloads in an object: {"items":[p1,p2,...]}
	// (the current API).
	BodyItems Body = iota + 1
	// BodyArray sends a bare JSON array: [p1,p2,...] (the seed's API).
	BodyArray
)

// Results says how a 2xx response is read.
type Results int

const (
	// ResultsPerItem requires {"results":[{"id","status","error"}...]} with
	// exactly one result per item, matched by position (the current API).
	// A 2xx without a readable, complete results array fails the whole
	// request as a retryable "bad_response": the items may or may not have
	// been stored, and retrying risks a duplicate rather than a loss.
	ResultsPerItem Results = iota + 1
	// ResultsIgnored treats any 2xx as "every item sent" and does not read
	// the body (the seed's API).
	ResultsIgnored
	// ResultsIfPresent reads per-item results when the 2xx body has a
	// "results" array, and otherwise treats the 2xx as "every item sent"
	// (for servers of mixed generations).
	ResultsIfPresent
)

// API describes one generation of the FlowCatalyst batch API: where each
// topic is posted, the body shape, the largest batch and how responses are
// read. Start from CurrentAPI or SeedAPI and change what differs.
type API struct {
	// EventsPath receives TopicEvent messages.
	EventsPath string
	// DispatchJobsPath receives TopicDispatchJob messages.
	DispatchJobsPath string
	// AuditLogsPath receives TopicAuditLog messages; "" means the topic is
	// not supported (its messages fail permanently with "unknown_topic").
	AuditLogsPath string
	// Body is the request body shape.
	Body Body
	// MaxBatchSize is the most items the server accepts in one request.
	MaxBatchSize int
	// Results says how a 2xx response is read.
	Results Results
}

// CurrentAPI is the API of the current FlowCatalyst platform
// (github.com/flowcatalyst/flowcatalyst): POST /api/events/batch,
// /api/dispatch-jobs/batch and /api/audit-logs/batch with
// {"items":[...]}, at most 1,000 items, answered by 201 and one result per
// item, in order. Per-item statuses SUCCESS and SKIPPED are sent,
// BAD_REQUEST and FORBIDDEN fail permanently, anything else is retried.
var CurrentAPI = API{
	EventsPath:       "/api/events/batch",
	DispatchJobsPath: "/api/dispatch-jobs/batch",
	AuditLogsPath:    "/api/audit-logs/batch",
	Body:             BodyItems,
	MaxBatchSize:     1000,
	Results:          ResultsPerItem,
}

// SeedAPI is the older API that seed 004 (the Java outbox processor) speaks:
// POST /api/events/batch and /api/dispatch/jobs/batch with a bare JSON
// array of at most 100 items; any 2xx means every item was stored.
var SeedAPI = API{
	EventsPath:       "/api/events/batch",
	DispatchJobsPath: "/api/dispatch/jobs/batch",
	Body:             BodyArray,
	MaxBatchSize:     100,
	Results:          ResultsIgnored,
}

// APIByName returns the preset named "current" (CurrentAPI) or "seed"
// (SeedAPI; "legacy" is accepted too), for flags and environment variables.
func APIByName(name string) (API, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "current", "":
		return CurrentAPI, nil
	case "seed", "legacy":
		return SeedAPI, nil
	}
	return API{}, fmt.Errorf("flowcatalyst: unknown API %q (want \"current\" or \"seed\")", name)
}

// path returns the endpoint of topic, or "".
func (a *API) path(topic string) string {
	switch topic {
	case TopicEvent:
		return a.EventsPath
	case TopicDispatchJob:
		return a.DispatchJobsPath
	case TopicAuditLog:
		return a.AuditLogsPath
	}
	return ""
}

// Topics returns the topics a has a path for.
func (a *API) Topics() []string {
	var ts []string
	for _, t := range []string{TopicAuditLog, TopicDispatchJob, TopicEvent} {
		if a.path(t) != "" {
			ts = append(ts, t)
		}
	}
	return ts
}

func (a *API) validate() error {
	if a.EventsPath == "" && a.DispatchJobsPath == "" && a.AuditLogsPath == "" {
		return fmt.Errorf("API has no path")
	}
	for _, p := range []string{a.EventsPath, a.DispatchJobsPath, a.AuditLogsPath} {
		if p != "" && !strings.HasPrefix(p, "/") {
			return fmt.Errorf("API path %q must start with /", p)
		}
	}
	if a.Body != BodyItems && a.Body != BodyArray {
		return fmt.Errorf("API.Body must be BodyItems or BodyArray")
	}
	if a.Results != ResultsPerItem && a.Results != ResultsIgnored && a.Results != ResultsIfPresent {
		return fmt.Errorf("API.Results must be ResultsPerItem, ResultsIgnored or ResultsIfPresent")
	}
	if a.MaxBatchSize < 1 {
		return fmt.Errorf("API.MaxBatchSize must be positive, got %d", a.MaxBatchSize)
	}
	return nil
}

// ItemStatus is the per-item status of the current API's batch response.
type ItemStatus string

// The per-item statuses FlowCatalyst returns.
const (
	// ItemSuccess: the item was stored.
	ItemSuccess ItemStatus = "SUCCESS"
	// ItemSkipped: the platform deliberately did not store the item (an
	// acknowledged, final outcome): treated as sent.
	ItemSkipped ItemStatus = "SKIPPED"
	// ItemBadRequest: the item is invalid: a permanent failure.
	ItemBadRequest ItemStatus = "BAD_REQUEST"
	// ItemForbidden: the caller may not write this item: a permanent failure.
	ItemForbidden ItemStatus = "FORBIDDEN"
	// ItemUnauthorized: retried.
	ItemUnauthorized ItemStatus = "UNAUTHORIZED"
	// ItemInternalError: retried.
	ItemInternalError ItemStatus = "INTERNAL_ERROR"
	// ItemGatewayError: retried.
	ItemGatewayError ItemStatus = "GATEWAY_ERROR"
)

// Sent reports whether s means the item was accepted (SUCCESS, SKIPPED).
func (s ItemStatus) Sent() bool { return s == ItemSuccess || s == ItemSkipped }

// Permanent reports whether s is a failure that retrying cannot fix
// (BAD_REQUEST, FORBIDDEN). Every other status that is not Sent, including
// unknown ones, is retryable.
func (s ItemStatus) Permanent() bool { return s == ItemBadRequest || s == ItemForbidden }

// ItemResult is one entry of the current API's batch response.
type ItemResult struct {
	// ID is the platform's id of the stored resource (not the outbox id).
	ID string `json:"id"`
	// Status is the item's outcome.
	Status ItemStatus `json:"status"`
	// Error describes a failure.
	Error string `json:"error,omitempty"`
}

// BatchResponse is the body of the current API's 2xx batch response.
type BatchResponse struct {
	Results []ItemResult `json:"results"`
}

// ErrorResponse is FlowCatalyst's error envelope: {"error":"CODE","message":"..."}.
type ErrorResponse struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}
