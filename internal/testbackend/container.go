package testbackend

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Container describes a server testcontainers-go starts when neither the
// environment variable nor the local port gives one, so a laptop with
// Docker runs the whole suite with no setup. One container per image is
// started per test binary and shared by its tests (each test still gets its
// own database, schema or prefix); the testcontainers reaper removes it
// when the binary exits. OUTBOXKIT_NO_CONTAINERS=1 turns the fallback off.
type Container struct {
	Image string
	// Port is the server's port in the container ("5432/tcp").
	Port string
	Env  map[string]string
	Cmd  []string
	// Ready is the log line (or lines, with Occurrences) that says the
	// server accepts connections; empty waits for the port only.
	Ready       string
	Occurrences int
	// Value renders the address the container listens on (host:port) as
	// the environment variable would hold it.
	Value func(hostPort string) string
}

// The containers of the backends (and Mongo, for its store's tests).
var (
	PostgresContainer = Container{
		Image: "postgres:17-alpine", Port: "5432/tcp",
		Env:   map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"},
		Ready: "database system is ready to accept connections", Occurrences: 2,
		Value: func(hp string) string { return "postgres://postgres@" + hp + "/postgres?sslmode=disable" },
	}
	MySQLContainer = Container{
		Image: "mysql:8.4", Port: "3306/tcp",
		Env:   map[string]string{"MYSQL_ALLOW_EMPTY_PASSWORD": "yes", "MYSQL_DATABASE": "test"},
		Ready: "port: 3306  MySQL Community Server",
		Value: func(hp string) string { return "root@tcp(" + hp + ")/test" },
	}
	RedisContainer = Container{
		Image: "redis:7-alpine", Port: "6379/tcp", Ready: "Ready to accept connections",
		Value: func(hp string) string { return hp },
	}
	RabbitMQContainer = Container{
		Image: "rabbitmq:3-alpine", Port: "5672/tcp", Ready: "Server startup complete",
		Value: func(hp string) string { return "amqp://guest:guest@" + hp + "/" },
	}
	NATSContainer = Container{
		Image: "nats:2-alpine", Port: "4222/tcp", Cmd: []string{"-js"}, Ready: "Server is ready",
		Value: func(hp string) string { return "nats://" + hp },
	}
	MongoContainer = Container{
		Image: "mongo:7", Port: "27017/tcp", Cmd: []string{"--replSet", "rs0", "--bind_ip_all"},
		Ready: "Waiting for connections",
		Value: func(hp string) string { return "mongodb://" + hp + "/?directConnection=true" },
	}
)

// started holds one start attempt per image.
var started sync.Map // image -> *startOnce

type startOnce struct {
	once  sync.Once
	value string
	err   error
}

// Start returns c's address as Value renders it, starting the container
// the first time (up to 3 minutes). Without Docker it returns an error
// saying so, quickly.
func (c Container) Start() (string, error) {
	if os.Getenv("OUTBOXKIT_NO_CONTAINERS") == "1" {
		return "", fmt.Errorf("containers are off (OUTBOXKIT_NO_CONTAINERS=1)")
	}
	v, _ := started.LoadOrStore(c.Image, &startOnce{})
	s := v.(*startOnce)
	s.once.Do(func() { s.value, s.err = c.start() })
	return s.value, s.err
}

func (c Container) start() (value string, err error) {
	defer func() {
		// testcontainers-go may panic when it finds no Docker at all.
		if r := recover(); r != nil {
			value, err = "", fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ready wait.Strategy = wait.ForListeningPort(c.Port)
	if c.Ready != "" {
		ready = wait.ForAll(wait.ForListeningPort(c.Port),
			wait.ForLog(c.Ready).WithOccurrence(max(c.Occurrences, 1)))
	}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image: c.Image, ExposedPorts: []string{c.Port}, Env: c.Env, Cmd: c.Cmd, WaitingFor: ready,
		},
		Started: true,
	})
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return "", fmt.Errorf("no %s container: %w", c.Image, err)
	}
	hp, err := ctr.PortEndpoint(ctx, c.Port, "")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return "", fmt.Errorf("%s container: %w", c.Image, err)
	}
	return c.Value(hp), nil
}

// LookupOrStart is Lookup with c as the last resort: the value of env if
// set, else def if defAddr answers, else a container's address. When all
// three fail it returns "" and a reason naming what it tried.
func LookupOrStart(env, def, defAddr string, c Container) (string, string) {
	v, why := Lookup(env, def, defAddr)
	if v != "" {
		return v, ""
	}
	v, err := c.Start()
	if err != nil {
		return "", why + ", and " + err.Error()
	}
	return v, ""
}
