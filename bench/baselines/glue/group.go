package main

// Two roles for the Kafka listener's tests (crates/onehop/tests/kafka/franz_go.rs), the same as
// confluent/group.py's and kafkajs/group.js's, so that one test drives all three clients:
//
//	group consume BROKER TOPIC GROUP
//	    A member of GROUP: prints each value it receives ("V <value>"), then commits it
//	    (CommitRecords, autocommit off) before the next, retrying while the server is away;
//	    SIGTERM closes the client, which leaves the group, and ends it with status 0.
//	group produce BROKER TOPIC FIRST COUNT
//	    An idempotent producer (franz-go's default; acks=all, lz4, linger 5 ms) writing keys
//	    kFIRST.. and values vFIRST..; prints each acknowledgement ("A <partition> <offset>
//	    <value>") or failure ("F <error>"), retrying across a server restart; ends with status 0
//	    once every record is acknowledged.
//
// Lines go to stdout, one write each; franz-go's own complaints go to stderr.

import (
	"context"
	"fmt"
	"math"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// How long a member may be silent before the group drops it, and how often it heartbeats.
const (
	groupSessionTimeout    = 10 * time.Second
	groupHeartbeatInterval = time.Second
	// A commit is retried this long after a failure (the server may be restarting).
	groupCommitRetryDelay = 200 * time.Millisecond
	// One commit attempt may take this long; it is not cut short by SIGTERM, so that the
	// record printed last is committed before the member leaves.
	groupCommitTimeout = 10 * time.Second
	// Records may wait this long for their acknowledgement, across a server restart.
	groupDeliveryTimeout = 120 * time.Second
)

func groupRoles(args []string) {
	usage := "usage: onehop-peer-glue group consume BROKER TOPIC GROUP | group produce BROKER TOPIC FIRST COUNT"
	if len(args) < 1 {
		fail("%s", usage)
	}
	switch {
	case args[0] == "consume" && len(args) == 4:
		groupConsume(args[1], args[2], args[3])
	case args[0] == "produce" && len(args) == 5:
		first, errFirst := strconv.Atoi(args[3])
		count, errCount := strconv.Atoi(args[4])
		if errFirst != nil || errCount != nil || first < 0 || count < 0 {
			fail("FIRST and COUNT are whole numbers; %s", usage)
		}
		groupProduce(args[1], args[2], first, count)
	default:
		fail("%s", usage)
	}
}

func groupConsume(broker, topic, group string) {
	stopping, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(broker),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(groupSessionTimeout),
		kgo.HeartbeatInterval(groupHeartbeatInterval),
	)
	if err != nil {
		fail("consumer: %v", err)
	}
	for stopping.Err() == nil {
		fetches := client.PollFetches(stopping)
		fetches.EachError(func(topic string, partition int32, err error) {
			if stopping.Err() == nil {
				logf("fetching %s/%d: %v", topic, partition, err)
			}
		})
		for records := fetches.RecordIter(); !records.Done() && stopping.Err() == nil; {
			record := records.Next()
			fmt.Printf("V %s\n", record.Value)
			for stopping.Err() == nil {
				ctx, cancel := context.WithTimeout(context.Background(), groupCommitTimeout)
				err := client.CommitRecords(ctx, record)
				cancel()
				if err == nil {
					break
				}
				logf("committing %s/%d@%d: %v", record.Topic, record.Partition, record.Offset, err)
				time.Sleep(groupCommitRetryDelay)
			}
		}
	}
	// Close leaves the group (LeaveGroup), so that the others take its partitions at once.
	client.Close()
}

func groupProduce(broker, topic string, first, count int) {
	client, err := kgo.NewClient(
		kgo.SeedBrokers(broker),
		kgo.DefaultProduceTopic(topic),
		// As librdkafka's and kafkajs's producers do by default: a topic not there yet is
		// created by the Metadata request (franz-go asks for it only when told to).
		kgo.AllowAutoTopicCreation(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordDeliveryTimeout(groupDeliveryTimeout),
		kgo.RecordRetries(math.MaxInt),
	)
	if err != nil {
		fail("producer: %v", err)
	}
	defer client.Close()
	var printing sync.Mutex
	failed := 0
	for i := first; i < first+count; i++ {
		record := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))}
		client.Produce(context.Background(), record, func(record *kgo.Record, err error) {
			printing.Lock()
			defer printing.Unlock()
			if err != nil {
				failed++
				fmt.Printf("F %v\n", err)
				return
			}
			fmt.Printf("A %d %d %s\n", record.Partition, record.Offset, record.Value)
		})
	}
	if err := client.Flush(context.Background()); err != nil {
		fail("flushing: %v", err)
	}
	printing.Lock()
	defer printing.Unlock()
	if failed > 0 {
		fail("%d records not acknowledged", failed)
	}
}
