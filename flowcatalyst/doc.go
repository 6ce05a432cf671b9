// Package flowcatalyst publishes outbox messages to FlowCatalyst, the
// multi-tenant event router of seed 004, and generates the TSIDs its outbox
// tables use as ids.
//
// # Publishing
//
// A Publisher implements outbox.Publisher for the FlowCatalyst batch API:
// messages with topic "EVENT" go to the events batch endpoint, "DISPATCH_JOB"
// to the dispatch-jobs batch endpoint. Each message's Payload is one item,
// sent as the JSON it is.
//
//	pub, err := flowcatalyst.New(flowcatalyst.Config{
//		BaseURL: "https://flowcatalyst.example.com",
//		API:     flowcatalyst.CurrentAPI, // or flowcatalyst.SeedAPI
//		Token:   flowcatalyst.StaticToken(os.Getenv("FLOWCATALYST_TOKEN")),
//	})
//	// ...
//	err = outbox.Run(ctx, store, pub, outbox.Config{})
//
// # API generations
//
// FlowCatalyst's batch contract changed over time, so the endpoint paths, the
// body shape, the batch limit and the way responses are read form an API
// value with two presets:
//
//   - CurrentAPI: /api/events/batch and /api/dispatch-jobs/batch, body
//     {"items":[...]}, at most 1,000 items, a 201 with one result per item
//     matched by position.
//   - SeedAPI: /api/events/batch and /api/dispatch/jobs/batch (the paths
//     seed 004 names), a bare JSON array, at most 100 items, any 2xx meaning
//     every item was stored.
//
// # Authentication
//
// Config.Token is a TokenSource: a StaticToken, or a *ClientCredentials that
// fetches, caches and refreshes tokens from an OAuth2 token endpoint (and
// fetches a new one after an HTTP 401). Tokens never appear in errors, in
// the errors stored on messages, or in logs.
//
// # Ids
//
// NewTSID returns 13-character, time-sorted ids for applications that write
// seed-004 outbox rows from Go.
//
// # Seed 004's tables
//
// The packages under flowcatalyst/seedstore (postgres, mysql, mongo: one
// per database) are outbox.Stores over seed 004's outbox_events and
// outbox_dispatch_jobs tables, so that outbox.Processor with this
// Publisher replaces the seed's processor for applications that write
// those tables; examples/flowcatalyst-processor is that program.
//
// # Compatibility
//
// The exported API follows semantic versioning with the rest of the module.
// The package flowcatalysttest provides a fake FlowCatalyst server for tests.
package flowcatalyst
