package main

// W4 on Kafka as study 1 ran it: a producer (acks=all, lz4, 5 ms linger, batches of at most
// 500 records) into a topic of 12 partitions replicated 3 times with min ISR 2, and a consumer
// in a group that takes up to 256 records or waits 50 ms from the first, then commits the
// batch synchronously.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type kafkaSettings struct {
	harness           harnessFlags
	brokers           string
	topic             string
	group             string
	partitions        int
	replication       int
	minInsync         int
	lingerMs          float64
	batchRecordsMax   int
	payloadBytes      int
	compression       string
	consumeRecordsMax int
	consumeWaitMs     float64
}

func kafkaIngest(args []string) {
	var settings kafkaSettings
	flags := flag.NewFlagSet("kafka-ingest", flag.ExitOnError)
	settings.harness.register(flags)
	flags.StringVar(&settings.brokers, "brokers", "", "bootstrap brokers, comma-separated host:port")
	flags.StringVar(&settings.topic, "topic", "", "the topic to create and use")
	flags.StringVar(&settings.group, "group", "", "the consumer group")
	flags.IntVar(&settings.partitions, "partitions", 12, "partitions of the topic")
	flags.IntVar(&settings.replication, "replication", 3, "replication factor of the topic")
	flags.IntVar(&settings.minInsync, "min-insync", 2, "min.insync.replicas of the topic")
	flags.Float64Var(&settings.lingerMs, "linger-ms", 5, "producer linger")
	flags.IntVar(&settings.batchRecordsMax, "batch-records-max", 500, "records per producer batch, at most")
	flags.IntVar(&settings.payloadBytes, "payload-bytes", 256, "record value size")
	flags.StringVar(&settings.compression, "compression", "lz4", "producer batch compression: lz4 or none")
	flags.IntVar(&settings.consumeRecordsMax, "consume-records-max", 256, "records per consumer batch, at most")
	flags.Float64Var(&settings.consumeWaitMs, "consume-wait-ms", 50, "how long a consumer batch waits after its first record")
	flags.Parse(args)
	if settings.harness.address == "" || settings.brokers == "" || settings.topic == "" || settings.group == "" {
		fail("kafka-ingest needs --harness, --brokers, --topic and --group")
	}
	if settings.payloadBytes < 16 {
		fail("--payload-bytes must be at least 16 (the intended time and the sequence number)")
	}
	brokers := splitList(settings.brokers)

	ctx, cancel := context.WithTimeout(context.Background(), settings.harness.setupTimeout)
	prepareTopic(ctx, brokers, &settings)
	consumer := startConsumer(ctx, brokers, &settings)
	producer := startProducer(ctx, brokers, &settings)
	cancel()

	// Ready: the harness's schedule starts once both connections are open.
	observeConn, observeWriter := connect(settings.harness.address, "observe")
	defer observeConn.Close()
	produceConn, produceWriter := connect(settings.harness.address, "produce")
	defer produceConn.Close()
	go consume(consumer, &settings, newLineWriter(observeWriter))
	produce(produceConn, producer, &settings, newLineWriter(produceWriter))
	logf("the harness closed the produce connection: done")
}

// prepareTopic waits for every broker, then creates the topic and waits until each partition
// has a leader and its full in-sync replica set.
func prepareTopic(ctx context.Context, brokers []string, settings *kafkaSettings) {
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		fail("admin client: %v", err)
	}
	defer client.Close()
	admin := kadm.NewClient(client)
	for {
		details, err := admin.ListBrokers(ctx)
		if err == nil && len(details) >= settings.replication {
			break
		}
		if ctx.Err() != nil {
			fail("the brokers did not all come up: %v (seen %d)", err, len(details))
		}
		time.Sleep(200 * time.Millisecond)
	}
	minInsync := strconv.Itoa(settings.minInsync)
	configs := map[string]*string{"min.insync.replicas": &minInsync}
	response, err := admin.CreateTopic(ctx, int32(settings.partitions), int16(settings.replication), configs, settings.topic)
	if err == nil {
		err = response.Err
	}
	if err != nil {
		fail("creating topic %s: %v", settings.topic, err)
	}
	for {
		topics, err := admin.ListTopics(ctx, settings.topic)
		if err == nil && topicReady(topics, settings) {
			logf("topic %s ready: %d partitions, replication %d, min.insync.replicas %d", settings.topic,
				settings.partitions, settings.replication, settings.minInsync)
			return
		}
		if ctx.Err() != nil {
			fail("topic %s never had every partition led and in sync: %v", settings.topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func topicReady(topics kadm.TopicDetails, settings *kafkaSettings) bool {
	detail, ok := topics[settings.topic]
	if !ok || detail.Err != nil || len(detail.Partitions) != settings.partitions {
		return false
	}
	for _, partition := range detail.Partitions {
		if partition.Err != nil || partition.Leader < 0 || len(partition.ISR) < settings.replication {
			return false
		}
	}
	return true
}

// startConsumer joins the group and returns once every partition is assigned, so no record
// the harness sends can precede the consumer.
func startConsumer(ctx context.Context, brokers []string, settings *kafkaSettings) *kgo.Client {
	assigned := make(chan struct{})
	var once sync.Once
	consumer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(settings.group),
		kgo.ConsumeTopics(settings.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, partitions map[string][]int32) {
			if len(partitions[settings.topic]) == settings.partitions {
				once.Do(func() { close(assigned) })
			}
		}),
	)
	if err != nil {
		fail("consumer client: %v", err)
	}
	// Polling is what joins the group; these polls return nothing (the topic is new and the
	// harness sends nothing before the glue connects).
	for {
		select {
		case <-assigned:
			logf("consumer group %s has all %d partitions", settings.group, settings.partitions)
			return consumer
		default:
		}
		if ctx.Err() != nil {
			fail("the consumer group %s was never assigned the topic's partitions", settings.group)
		}
		pollContext, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if records := consumer.PollRecords(pollContext, 1).Records(); len(records) > 0 {
			fail("the new topic %s already had a record", settings.topic)
		}
		cancel()
	}
}

func startProducer(ctx context.Context, brokers []string, settings *kafkaSettings) *kgo.Client {
	compression := kgo.NoCompression()
	if settings.compression == "lz4" {
		compression = kgo.Lz4Compression()
	}
	// franz-go caps a batch by bytes: this many fit batchRecordsMax records of this size
	// (record overhead in a v2 batch is ~20 bytes without key or headers).
	batchBytes := int32(settings.batchRecordsMax * (settings.payloadBytes + 20))
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DefaultProduceTopic(settings.topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(time.Duration(settings.lingerMs*float64(time.Millisecond))),
		kgo.ProducerBatchCompression(compression),
		kgo.ProducerBatchMaxBytes(batchBytes),
	)
	if err != nil {
		fail("producer client: %v", err)
	}
	// Metadata for the topic before the first event, as a running producer would have it.
	producer.ForceMetadataRefresh()
	if _, err := kadm.NewClient(producer).ListTopics(ctx, settings.topic); err != nil {
		fail("producer metadata: %v", err)
	}
	return producer
}

// produce reads the harness's events and produces one record per event, answering each once
// the broker acknowledged it.
func produce(conn interface{ Read([]byte) (int, error) }, producer *kgo.Client, settings *kafkaSettings, answers *lineWriter) {
	reader := bufio.NewReaderSize(conn, 64*1024)
	for {
		line, err := reader.ReadString('\n')
		if err != nil {
			producer.Flush(context.Background())
			return
		}
		fields := strings.Fields(line)
		if len(fields) != 3 || fields[0] != "P" {
			fail("the harness sent %q", line)
		}
		seq, errSeq := strconv.ParseUint(fields[1], 10, 64)
		intended, errIntended := strconv.ParseUint(fields[2], 10, 64)
		if errSeq != nil || errIntended != nil {
			fail("the harness sent %q", line)
		}
		value := make([]byte, settings.payloadBytes)
		binary.LittleEndian.PutUint64(value[0:8], intended)
		binary.LittleEndian.PutUint64(value[8:16], seq)
		for index := 16; index < len(value); index++ {
			value[index] = 'x'
		}
		producer.Produce(context.Background(), &kgo.Record{Value: value}, func(record *kgo.Record, err error) {
			if err != nil {
				answers.send("F " + strconv.FormatUint(seq, 10) + " " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
				return
			}
			answers.send("A " + strconv.FormatUint(seq, 10) + "\n")
		})
	}
}

// consume takes batches of up to consumeRecordsMax records, or what arrived within
// consumeWaitMs of a batch's first record, reports each record as it is received, commits the
// batch synchronously and reports it committed.
func consume(consumer *kgo.Client, settings *kafkaSettings, reports *lineWriter) {
	wait := time.Duration(settings.consumeWaitMs * float64(time.Millisecond))
	for {
		var batch []*kgo.Record
		var deadline time.Time
		for len(batch) < settings.consumeRecordsMax {
			pollContext := context.Background()
			var cancel context.CancelFunc = func() {}
			if len(batch) > 0 {
				pollContext, cancel = context.WithDeadline(pollContext, deadline)
			}
			fetches := consumer.PollRecords(pollContext, settings.consumeRecordsMax-len(batch))
			cancel()
			if fetches.IsClientClosed() {
				return
			}
			fetches.EachError(func(topic string, partition int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					logf("fetch %s/%d: %v", topic, partition, err)
				}
			})
			records := fetches.Records()
			if len(records) > 0 && len(batch) == 0 {
				deadline = time.Now().Add(wait)
			}
			report(reports, 'R', records)
			batch = append(batch, records...)
			if len(batch) > 0 && !time.Now().Before(deadline) {
				break
			}
		}
		if err := consumer.CommitRecords(context.Background(), batch...); err != nil {
			logf("commit of %d records failed: %v", len(batch), err)
			continue
		}
		report(reports, 'C', batch)
	}
}

func report(reports *lineWriter, kind byte, records []*kgo.Record) {
	if len(records) == 0 {
		return
	}
	var lines strings.Builder
	for _, record := range records {
		if len(record.Value) < 16 {
			continue
		}
		lines.WriteByte(kind)
		lines.WriteByte(' ')
		lines.WriteString(strconv.FormatUint(binary.LittleEndian.Uint64(record.Value[8:16]), 10))
		lines.WriteByte('\n')
	}
	reports.send(lines.String())
}
