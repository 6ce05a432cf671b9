// Command genmethods writes the methods.go of store/mysql and store/sqlite:
// the Store's methods that internal/sqlstore's shared code does, each a
// one-line call of it under its doc comment, rendered from one template
// (methods.go.tmpl) for both stores. They are declared in each store's
// package so that go doc lists them on its Store (a method promoted from an
// embedded type of another package is not listed). Each store runs it with
// go generate:
//
//	//go:generate go run ../../internal/sqlstore/genmethods -pkg mysql
//
// and a test of this package fails when a store's methods.go differs from
// what the template renders.
package main

import (
	"bytes"
	_ "embed"
	"flag"
	"fmt"
	"go/format"
	"os"
	"text/template"
)

//go:embed methods.go.tmpl
var methodsTmpl string

// stores are the packages the template is rendered for.
var stores = []string{"mysql", "sqlite"}

// render returns the methods.go of store package pkg.
func render(pkg string) ([]byte, error) {
	known := false
	for _, s := range stores {
		known = known || s == pkg
	}
	if !known {
		return nil, fmt.Errorf("unknown store package %q (want one of %v)", pkg, stores)
	}
	t, err := template.New("methods.go.tmpl").Option("missingkey=error").Parse(methodsTmpl)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, struct{ Pkg string }{pkg}); err != nil {
		return nil, err
	}
	return format.Source(b.Bytes())
}

func main() {
	pkg := flag.String("pkg", "", "the store package: mysql or sqlite")
	out := flag.String("out", "methods.go", "the file to write")
	flag.Parse()
	src, err := render(*pkg)
	if err == nil {
		err = os.WriteFile(*out, src, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genmethods:", err)
		os.Exit(1)
	}
}
