package admin_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/outboxkit/outboxkit/outbox"
	"github.com/outboxkit/outboxkit/outbox/admin"
	"github.com/outboxkit/outboxkit/store/sqlite"
)

// Mount the admin handler behind the host's authentication and read the
// stats an operator's dashboard shows.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outboxkit-admin-")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		panic(err)
	}
	ob := outbox.New[*sql.Tx](st, outbox.Options{})
	if _, err := ob.Enqueue(ctx, outbox.Message{Topic: "orders", Payload: []byte(`{"order":1}`)}); err != nil {
		panic(err)
	}

	h, err := admin.New(admin.Config{
		Store: st,
		Authorize: func(r *http.Request) error {
			if r.Header.Get("Authorization") != "Bearer s3cret" {
				return errors.New("not an operator")
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", h)) // the dashboard is at /outbox/
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/outbox/api/stats", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	res.Body.Close()
	fmt.Println("without a token:", res.StatusCode)

	req.Header.Set("Authorization", "Bearer s3cret")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	var stats admin.Stats
	if err := json.NewDecoder(res.Body).Decode(&stats); err != nil {
		panic(err)
	}
	fmt.Println("topic:", stats.Topics[0].Topic, "pending:", stats.Topics[0].Counts[outbox.StatusPending])
	// Output:
	// without a token: 401
	// topic: orders pending: 1
}
