package main

// Study 4, the queue: N messages of S bytes, P producers and C consumers, acknowledged
// consumption, through Kafka's protocol (franz-go; a Kafka broker or onehop) or Redis Streams
// consumer groups (go-redis; XADD, XREADGROUP, XACK).
//
// Closed loop, as the study ran it: each producer sends its next message once the previous one
// is acknowledged (Kafka: acks=all, idempotent; Redis: XADD's reply). Each consumer takes
// what is there (Kafka: a group member's poll; Redis: XREADGROUP COUNT 100 BLOCK 100 ms),
// records each message's latency, then acknowledges the batch (Kafka: a synchronous offset
// commit; Redis: XACK) before taking more. A message carries its sequence number and the time
// it was sent, on this process's monotonic clock, so producers and consumers share one clock.
//
// Prints one JSON line: messages sent and received (distinct), duplicates, the seconds from the
// first send to the last receipt, msg/s over that span, and latency percentiles.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type queueSettings struct {
	system       string
	address      string
	name         string
	messages     int
	bytes        int
	producers    int
	consumers    int
	partitions   int
	timeout      time.Duration
	setupTimeout time.Duration
}

// queueRun is what producers and consumers share.
type queueRun struct {
	settings  *queueSettings
	start     time.Time
	seen      []atomic.Bool
	received  atomic.Int64
	duplicate atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	latencies []time.Duration
	lastNs    atomic.Int64
	sent      atomic.Int64
	// Each send's wait for its acknowledgement.
	acks []time.Duration
	// Partitions assigned to the consumers now (Kafka), and how often that changed: producing
	// starts once all are, and have stayed so.
	assigned atomic.Int64
	changes  atomic.Int64
}

func queueStudy(args []string) {
	var settings queueSettings
	flags := flag.NewFlagSet("queue", flag.ExitOnError)
	flags.StringVar(&settings.system, "system", "", "kafka (any Kafka-protocol broker) or redis (Redis Streams)")
	flags.StringVar(&settings.address, "address", "", "bootstrap broker, or the Redis server (host:port)")
	flags.StringVar(&settings.name, "name", "", "the topic or stream, and its consumer group, created for the run")
	flags.IntVar(&settings.messages, "messages", 100000, "messages in all")
	flags.IntVar(&settings.bytes, "bytes", 1024, "message size")
	flags.IntVar(&settings.producers, "producers", 10, "producers, each sending its share in a closed loop")
	flags.IntVar(&settings.consumers, "consumers", 10, "consumers in one group")
	flags.IntVar(&settings.partitions, "partitions", 10, "partitions of the topic (Kafka)")
	flags.DurationVar(&settings.timeout, "timeout", 10*time.Minute, "longest the run may take")
	flags.DurationVar(&settings.setupTimeout, "setup-timeout", 120*time.Second, "how long the server may take to be ready")
	flags.Parse(args)
	if settings.address == "" || settings.name == "" || settings.bytes < 16 || settings.messages < 1 {
		fail("queue needs --system, --address, --name, and --bytes of at least 16")
	}
	run := &queueRun{settings: &settings, seen: make([]atomic.Bool, settings.messages), done: make(chan struct{})}
	var produce func(int, []int)
	var consume func(int)
	switch settings.system {
	case "kafka":
		produce, consume = kafkaQueue(run)
	case "redis":
		produce, consume = redisQueue(run)
	default:
		fail("--system is kafka or redis, not %q", settings.system)
	}

	var consumers sync.WaitGroup
	for c := 0; c < settings.consumers; c++ {
		consumers.Add(1)
		go func(c int) { defer consumers.Done(); consume(c) }(c)
	}
	// Consumers join first: a group still forming would count its rebalances as latency.
	if settings.system == "kafka" && settings.consumers > 0 {
		// Members join one after another, each join a rebalance: wait until every partition
		// has been assigned, with nothing revoked, for 2 s on end.
		deadline := time.Now().Add(settings.setupTimeout)
		stableSince := time.Now()
		last := int64(-1)
		for {
			now := run.assigned.Load() + 1000000*run.changes.Load()
			if now != last {
				last, stableSince = now, time.Now()
			}
			if run.assigned.Load() == int64(settings.partitions) && time.Since(stableSince) > 2*time.Second {
				break
			}
			if time.Now().After(deadline) {
				fail("the consumer group never settled with every partition assigned (%d of %d)", run.assigned.Load(), settings.partitions)
			}
			time.Sleep(50 * time.Millisecond)
		}
		logf("the group of %d consumers has its %d partitions", settings.consumers, settings.partitions)
	}
	time.Sleep(500 * time.Millisecond)
	run.start = time.Now()
	var producers sync.WaitGroup
	for p := 0; p < settings.producers; p++ {
		var share []int
		for seq := p; seq < settings.messages; seq += settings.producers {
			share = append(share, seq)
		}
		producers.Add(1)
		go func(p int, share []int) { defer producers.Done(); produce(p, share) }(p, share)
	}
	go progress(run)
	producers.Wait()
	if settings.consumers == 0 {
		// Producers alone: the acknowledgement round trip without consumers' load.
		run.lastNs.Store(int64(time.Since(run.start)))
		run.finish()
	}
	select {
	case <-run.done:
	case <-time.After(settings.timeout):
		logf("timed out with %d of %d received", run.received.Load(), settings.messages)
		run.finish()
	}
	consumers.Wait()
	reportQueue(run)
}

func (run *queueRun) finish() {
	run.closeOnce.Do(func() { close(run.done) })
}

func (run *queueRun) stopped() bool {
	select {
	case <-run.done:
		return true
	default:
		return false
	}
}

// payload is a message: its sequence number, the nanoseconds since the run began when it was
// sent, then padding.
func (run *queueRun) payload(seq int) []byte {
	message := make([]byte, run.settings.bytes)
	binary.BigEndian.PutUint64(message[0:8], uint64(seq))
	binary.BigEndian.PutUint64(message[8:16], uint64(time.Since(run.start).Nanoseconds()))
	for i := 16; i < len(message); i++ {
		message[i] = byte('a' + i%26)
	}
	return message
}

// received takes in one consumed message.
func (run *queueRun) took(message []byte, at time.Duration, latencies *[]time.Duration) {
	if len(message) < 16 {
		return
	}
	seq := int(binary.BigEndian.Uint64(message[0:8]))
	sent := time.Duration(binary.BigEndian.Uint64(message[8:16]))
	if seq < 0 || seq >= len(run.seen) {
		return
	}
	if run.seen[seq].Swap(true) {
		run.duplicate.Add(1)
		return
	}
	*latencies = append(*latencies, at-sent)
	run.lastNs.Store(int64(at))
	if run.received.Add(1) == int64(len(run.seen)) {
		run.finish()
	}
}

func (run *queueRun) keep(latencies []time.Duration) {
	run.mu.Lock()
	run.latencies = append(run.latencies, latencies...)
	run.mu.Unlock()
}

func (run *queueRun) keepAcks(acks []time.Duration) {
	run.mu.Lock()
	run.acks = append(run.acks, acks...)
	run.mu.Unlock()
}

// percentileMs is the p-th quantile of sorted durations, in milliseconds.
func percentileMs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))].Microseconds()) / 1000
}

func progress(run *queueRun) {
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-run.done:
			return
		case <-ticker.C:
			logf("%s: %d sent, %d received of %d", run.settings.system, run.sent.Load(), run.received.Load(), run.settings.messages)
		}
	}
}

func reportQueue(run *queueRun) {
	sort.Slice(run.latencies, func(i, j int) bool { return run.latencies[i] < run.latencies[j] })
	sort.Slice(run.acks, func(i, j int) bool { return run.acks[i] < run.acks[j] })
	percentile := func(p float64) float64 { return percentileMs(run.latencies, p) }
	seconds := time.Duration(run.lastNs.Load()).Seconds()
	rate := 0.0
	counted := run.received.Load()
	if run.settings.consumers == 0 {
		counted = run.sent.Load()
	}
	if seconds > 0 {
		rate = float64(counted) / seconds
	}
	out, _ := json.Marshal(map[string]any{
		"system":     run.settings.system,
		"messages":   run.settings.messages,
		"bytes":      run.settings.bytes,
		"producers":  run.settings.producers,
		"consumers":  run.settings.consumers,
		"sent":       run.sent.Load(),
		"received":   run.received.Load(),
		"duplicates": run.duplicate.Load(),
		"seconds":    seconds,
		"msg_per_s":  rate,
		"p50_ms":     percentile(0.50),
		"p99_ms":     percentile(0.99),
		"max_ms":     percentile(1.0),
		"ack_p50_ms": percentileMs(run.acks, 0.50),
		"ack_p99_ms": percentileMs(run.acks, 0.99),
	})
	fmt.Println(string(out))
	if run.settings.consumers > 0 && run.received.Load() < int64(run.settings.messages) {
		os.Exit(1)
	}
}

// kafkaQueue: a topic of --partitions; each producer an idempotent acks=all client waiting for
// each record's acknowledgement; each consumer a group member committing each poll.
func kafkaQueue(run *queueRun) (func(int, []int), func(int)) {
	settings := run.settings
	ctx, cancel := context.WithTimeout(context.Background(), settings.setupTimeout)
	defer cancel()
	admin, err := kgo.NewClient(kgo.SeedBrokers(settings.address))
	if err != nil {
		fail("admin client: %v", err)
	}
	defer admin.Close()
	for {
		response, err := kadm.NewClient(admin).CreateTopic(ctx, int32(settings.partitions), 1, nil, settings.name)
		if err == nil {
			err = response.Err
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			fail("creating topic %s: %v", settings.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	produce := func(p int, share []int) {
		client, err := kgo.NewClient(kgo.SeedBrokers(settings.address), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(0), kgo.DefaultProduceTopic(settings.name))
		if err != nil {
			fail("producer: %v", err)
		}
		defer client.Close()
		acks := make([]time.Duration, 0, len(share))
		for _, seq := range share {
			record := &kgo.Record{Key: []byte(strconv.Itoa(seq)), Value: run.payload(seq)}
			sent := time.Now()
			if err := client.ProduceSync(context.Background(), record).FirstErr(); err != nil {
				fail("producing: %v", err)
			}
			acks = append(acks, time.Since(sent))
			run.sent.Add(1)
		}
		run.keepAcks(acks)
	}
	consume := func(c int) {
		count := func(assigned map[string][]int32) (n int64) {
			for _, partitions := range assigned {
				n += int64(len(partitions))
			}
			return n
		}
		client, err := kgo.NewClient(kgo.SeedBrokers(settings.address), kgo.ConsumerGroup(settings.name),
			kgo.ConsumeTopics(settings.name), kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
				run.assigned.Add(count(assigned))
				run.changes.Add(1)
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
				run.assigned.Add(-count(revoked))
				run.changes.Add(1)
			}),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
				run.assigned.Add(-count(lost))
				run.changes.Add(1)
			}))
		if err != nil {
			fail("consumer: %v", err)
		}
		defer client.Close()
		var latencies []time.Duration
		for !run.stopped() {
			pollCtx, cancelPoll := context.WithTimeout(context.Background(), 200*time.Millisecond)
			fetches := client.PollFetches(pollCtx)
			cancelPoll()
			at := time.Since(run.start)
			fetches.EachRecord(func(record *kgo.Record) { run.took(record.Value, at, &latencies) })
			if fetches.NumRecords() > 0 {
				if err := client.CommitUncommittedOffsets(context.Background()); err != nil {
					logf("consumer %d: commit: %v", c, err)
				}
			}
		}
		run.keep(latencies)
	}
	return produce, consume
}

// redisQueue: one stream and one consumer group; each producer XADDs and waits for the reply;
// each consumer reads up to 100 new entries (blocking 100 ms), then XACKs them.
func redisQueue(run *queueRun) (func(int, []int), func(int)) {
	settings := run.settings
	ctx, cancel := context.WithTimeout(context.Background(), settings.setupTimeout)
	defer cancel()
	admin := redis.NewClient(&redis.Options{Addr: settings.address})
	defer admin.Close()
	for {
		err := admin.XGroupCreateMkStream(ctx, settings.name, settings.name, "$").Err()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			fail("creating stream %s: %v", settings.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	produce := func(p int, share []int) {
		client := redis.NewClient(&redis.Options{Addr: settings.address})
		defer client.Close()
		acks := make([]time.Duration, 0, len(share))
		for _, seq := range share {
			arguments := &redis.XAddArgs{Stream: settings.name, Values: []any{"m", run.payload(seq)}}
			sent := time.Now()
			if err := client.XAdd(context.Background(), arguments).Err(); err != nil {
				fail("XADD: %v", err)
			}
			acks = append(acks, time.Since(sent))
			run.sent.Add(1)
		}
		run.keepAcks(acks)
	}
	consume := func(c int) {
		client := redis.NewClient(&redis.Options{Addr: settings.address})
		defer client.Close()
		name := fmt.Sprintf("consumer-%d", c)
		var latencies []time.Duration
		for !run.stopped() {
			streams, err := client.XReadGroup(context.Background(), &redis.XReadGroupArgs{
				Group: settings.name, Consumer: name, Streams: []string{settings.name, ">"},
				Count: 100, Block: 100 * time.Millisecond,
			}).Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				logf("consumer %d: XREADGROUP: %v", c, err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			at := time.Since(run.start)
			var ids []string
			for _, stream := range streams {
				for _, message := range stream.Messages {
					if value, ok := message.Values["m"].(string); ok {
						run.took([]byte(value), at, &latencies)
					}
					ids = append(ids, message.ID)
				}
			}
			if len(ids) > 0 {
				if err := client.XAck(context.Background(), settings.name, settings.name, ids...).Err(); err != nil {
					logf("consumer %d: XACK: %v", c, err)
				}
			}
		}
		run.keep(latencies)
	}
	return produce, consume
}
