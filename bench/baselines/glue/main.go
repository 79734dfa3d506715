// onehop-peer-glue is the application side of the conventional stacks that `onehop bench`
// measures beside onehop: the producer and the consumer a team would write around a broker,
// written with the client library the published studies used (franz-go for Kafka).
//
// The harness drives it and keeps every clock. It starts one glue process per run, listening
// on a loopback port of its own; the glue prepares the broker side (topic, consumer group),
// then opens two connections to that port:
//
//	produce: first line "produce"; the harness writes "P <seq> <intended_ns>\n" per event,
//	         the glue answers "A <seq>\n" once the broker acknowledged it (acks=all), or
//	         "F <seq> <reason>\n".
//	observe: first line "observe"; the glue writes "R <seq>\n" when its consumer receives a
//	         record and "C <seq>\n" once the batch holding it is committed.
//
// The harness stamps each line when its bytes reach its socket, on its own clock, exactly as
// it stamps a subscriber's receipt from onehop. The glue reads no clock for the figures.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: onehop-peer-glue kafka-ingest|queue|rebalance|streams|codecs|group [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "kafka-ingest":
		kafkaIngest(os.Args[2:])
	case "queue":
		queueStudy(os.Args[2:])
	case "rebalance":
		rebalanceStudy(os.Args[2:])
	case "streams":
		streamsStudy(os.Args[2:])
	case "codecs":
		codecsCheck(os.Args[2:])
	case "group":
		groupRoles(os.Args[2:])
	case "version":
		printVersion()
	default:
		fmt.Fprintf(os.Stderr, "onehop-peer-glue: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

// printVersion prints the Go version and the client libraries the glue was built with, for
// the reports.
func printVersion() {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Println("unknown")
		return
	}
	parts := []string{info.GoVersion}
	for _, module := range info.Deps {
		if strings.HasPrefix(module.Path, "github.com/twmb/franz-go") || strings.HasPrefix(module.Path, "github.com/redis/go-redis") {
			parts = append(parts, module.Path+" "+module.Version)
		}
	}
	fmt.Println(strings.Join(parts, ", "))
}

// harnessFlags are the flags every command takes.
type harnessFlags struct {
	address      string
	setupTimeout time.Duration
}

func (h *harnessFlags) register(flags *flag.FlagSet) {
	flags.StringVar(&h.address, "harness", "", "the harness's loopback address (host:port)")
	flags.DurationVar(&h.setupTimeout, "setup-timeout", 120*time.Second, "how long the broker may take to be ready")
}

// connect opens one connection to the harness and names its role on the first line.
func connect(address, role string) (net.Conn, *bufio.Writer) {
	conn, err := net.Dial("tcp", address)
	if err != nil {
		fail("connecting to the harness at %s: %v", address, err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetNoDelay(true)
	}
	writer := bufio.NewWriterSize(conn, 64*1024)
	fmt.Fprintf(writer, "%s\n", role)
	if err := writer.Flush(); err != nil {
		fail("greeting the harness: %v", err)
	}
	return conn, writer
}

// lineWriter serializes lines from many goroutines onto one connection: a writer goroutine
// flushes whenever it has nothing more queued, so a burst goes out in one write and a lone
// line goes out at once.
type lineWriter struct {
	lines chan string
}

// Lines queued for the harness at most: a full queue blocks the glue rather than growing.
const linesQueuedMax = 65536

func newLineWriter(writer *bufio.Writer) *lineWriter {
	out := &lineWriter{lines: make(chan string, linesQueuedMax)}
	go func() {
		for line := range out.lines {
			writer.WriteString(line)
			for more := true; more; {
				select {
				case next, ok := <-out.lines:
					if !ok {
						more = false
						break
					}
					writer.WriteString(next)
				default:
					more = false
				}
			}
			if err := writer.Flush(); err != nil {
				fail("writing to the harness: %v", err)
			}
		}
	}()
	return out
}

func (out *lineWriter) send(line string) {
	out.lines <- line
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "onehop-peer-glue: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s onehop-peer-glue: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func splitList(text string) []string {
	var items []string
	for _, item := range strings.Split(text, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}
