package main

// The time a consumer group takes to rebalance, through Kafka's protocol (franz-go, its
// default cooperative-sticky assignor, default heartbeats). A first member takes every
// partition; then, per round, a second member joins (timed from its start until the two hold
// every partition between them, the newcomer some) and leaves (timed from its close until the
// first holds every partition again).
//
// Prints one JSON line: the join and leave times of every round, in milliseconds.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// member is one consumer of the group and the partitions it holds now.
type member struct {
	client *kgo.Client
	mu     sync.Mutex
	held   int
}

func (m *member) holding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

func joinGroup(address, name string) *member {
	m := &member{}
	count := func(partitions map[string][]int32) (n int) {
		for _, list := range partitions {
			n += len(list)
		}
		return n
	}
	change := func(delta int) {
		m.mu.Lock()
		m.held += delta
		m.mu.Unlock()
	}
	client, err := kgo.NewClient(kgo.SeedBrokers(address), kgo.ConsumerGroup(name), kgo.ConsumeTopics(name),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, p map[string][]int32) { change(count(p)) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, p map[string][]int32) { change(-count(p)) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, p map[string][]int32) { change(-count(p)) }))
	if err != nil {
		fail("consumer: %v", err)
	}
	m.client = client
	// Polling drives the group membership.
	go func() {
		for {
			fetches := client.PollFetches(context.Background())
			if fetches.IsClientClosed() {
				return
			}
		}
	}()
	return m
}

// waitUntil polls condition every millisecond until it holds; how long that took.
func waitUntil(from time.Time, timeout time.Duration, condition func() bool, what string) time.Duration {
	for !condition() {
		if time.Since(from) > timeout {
			fail("%s did not happen within %s", what, timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(from)
}

func rebalanceStudy(args []string) {
	flags := flag.NewFlagSet("rebalance", flag.ExitOnError)
	address := flags.String("address", "", "bootstrap broker (host:port)")
	name := flags.String("name", "", "the topic and group created for the run")
	partitions := flags.Int("partitions", 12, "partitions of the topic")
	rounds := flags.Int("rounds", 5, "joins and leaves")
	timeout := flags.Duration("timeout", 120*time.Second, "longest one rebalance may take")
	flags.Parse(args)
	if *address == "" || *name == "" {
		fail("rebalance needs --address and --name")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	admin, err := kgo.NewClient(kgo.SeedBrokers(*address))
	if err != nil {
		fail("admin client: %v", err)
	}
	for {
		response, err := kadm.NewClient(admin).CreateTopic(ctx, int32(*partitions), 1, nil, *name)
		if err == nil {
			err = response.Err
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			fail("creating topic %s: %v", *name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	admin.Close()
	cancel()

	first := joinGroup(*address, *name)
	defer first.client.Close()
	waitUntil(time.Now(), *timeout, func() bool { return first.holding() == *partitions }, "the first member's assignment")
	var joins, leaves []float64
	for round := 0; round < *rounds; round++ {
		started := time.Now()
		second := joinGroup(*address, *name)
		joined := waitUntil(started, *timeout, func() bool {
			return second.holding() > 0 && first.holding()+second.holding() == *partitions
		}, "a join's rebalance")
		joins = append(joins, float64(joined.Microseconds())/1000)
		// Settle before the leave, so the two rebalances are not counted together.
		time.Sleep(time.Second)
		left := time.Now()
		second.client.Close()
		gone := waitUntil(left, *timeout, func() bool { return first.holding() == *partitions }, "a leave's rebalance")
		leaves = append(leaves, float64(gone.Microseconds())/1000)
		logf("round %d: join %.0f ms, leave %.0f ms", round+1, joins[round], leaves[round])
		time.Sleep(time.Second)
	}
	out, _ := json.Marshal(map[string]any{"partitions": *partitions, "join_ms": joins, "leave_ms": leaves})
	fmt.Println(string(out))
}
