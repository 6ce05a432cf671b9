package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestStoresAreCurrent: each store's methods.go is what the template
// renders (run go generate ./store/... after changing the template).
func TestStoresAreCurrent(t *testing.T) {
	for _, pkg := range stores {
		want, err := render(pkg)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "..", "..", "store", pkg, "methods.go")
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what internal/sqlstore/genmethods renders: run go generate ./store/%s", path, pkg)
		}
	}
}

// TestRenderRefusesAnUnknownStore: the template is rendered only for the
// stores that share internal/sqlstore.
func TestRenderRefusesAnUnknownStore(t *testing.T) {
	if _, err := render("postgres"); err == nil {
		t.Fatal("render(postgres) succeeded")
	}
}
