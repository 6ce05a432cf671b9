module github.com/outboxkit/outboxkit

go 1.25
