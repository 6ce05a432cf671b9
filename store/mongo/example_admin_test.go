package mongo_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/store/mongo"
)

// Print the schema as mongosh commands, for a team that applies its
// schema itself (outboxctl migrate sql --url mongodb://host/db prints the
// same). Rendering needs no server.
func ExampleStore_Migrations() {
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	store, err := mongo.New(client.Database("shop"), mongo.Options{TablePrefix: "shop_outbox_"})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range store.Migrations() {
		first, _, _ := strings.Cut(m.Up, "\n")
		fmt.Printf("%03d_%s: %d commands, first %.60s…\n", m.Version, m.Name, strings.Count(m.Up, "\n"), first)
	}
	// Output:
	// 001_init: 3 commands, first db.runCommand({"createIndexes":"shop_outbox_messages","index…
	// 002_admin: 2 commands, first db.runCommand({"createIndexes":"shop_outbox_messages","index…
}

// An operator pauses a topic whose consumer is down, then, once it is
// back, resumes it and requeues its dead letters in chunks after a dry
// run. store implements outbox.Admin, as every store of this module does.
func ExampleStore_MessageRequeueMany() {
	ctx := context.Background()
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)
	store, err := mongo.New(client.Database("shop"), mongo.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.PauseAdd(ctx, outbox.PauseAddParams{Topic: "invoices"}); err != nil {
		log.Fatal(err)
	}
	// ... the consumer is repaired ...
	if _, err := store.PauseRemove(ctx, outbox.PauseRemoveParams{Topic: "invoices"}); err != nil {
		log.Fatal(err)
	}
	p := outbox.MessageRequeueManyParams{Filter: outbox.MessageFilter{Topic: "invoices", ErrorCode: "http_503"}, DryRun: true}
	dry, err := outbox.RequeueAll(ctx, store, p, nil)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d dead letters would be requeued", dry.Matched)
	p.DryRun = false
	done, err := outbox.RequeueAll(ctx, store, p, func(r outbox.RequeueManyResult) {
		log.Printf("chunk: %d requeued", r.Requeued)
	})
	if err != nil {
		log.Fatalf("stopped after %d; resume from seq %d: %v", done.Requeued, done.NextAfterSeq, err)
	}
}
