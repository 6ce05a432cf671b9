package main

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// pgCPU returns the CPU time (user + system, with reaped children) of every
// process named postgres on this machine, from /proc, and false when the
// server is not local (by the DSN's host) or /proc shows none. It counts
// every client of the server: other work on it inflates the figure.
func pgCPU(dsn string) (time.Duration, bool) {
	if !localDSN(dsn) {
		return 0, false
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	found := false
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open || s[open+1:closing] != "postgres" {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 15 {
			continue
		}
		// Fields after the command: state is f[0]; utime, stime, cutime,
		// cstime are fields 14-17 of stat, f[11..14] here.
		for _, v := range f[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		found = true
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ticks) * time.Second / hz, found
}

func localDSN(dsn string) bool {
	host := ""
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		host = u.Hostname()
		if h := u.Query().Get("host"); h != "" {
			host = h
		}
	} else {
		for _, kv := range strings.Fields(dsn) {
			if v, ok := strings.CutPrefix(kv, "host="); ok {
				host = v
			}
		}
	}
	return host == "" || host == "localhost" || host == "127.0.0.1" || host == "::1" || strings.HasPrefix(host, "/")
}
