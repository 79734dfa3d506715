package main

// A check of a Kafka-protocol broker with franz-go, for the Kafka listener's tests: an
// idempotent producer (acks=all) writes 100 keyed records with each codec (none, gzip, snappy,
// lz4, zstd), each with a header; then a consumer group reads the topic from the start and
// commits. Prints one JSON line: how many were acknowledged, the distinct values read and their
// count, the records whose header came back, and the offsets the group committed in all.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func codecsCheck(args []string) {
	flags := flag.NewFlagSet("codecs", flag.ExitOnError)
	address := flags.String("address", "", "bootstrap broker (host:port)")
	topic := flags.String("topic", "", "the topic to create and use")
	group := flags.String("group", "", "the consumer group")
	flags.Parse(args)
	if *address == "" || *topic == "" || *group == "" {
		fail("codecs needs --address, --topic and --group")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, err := kgo.NewClient(kgo.SeedBrokers(*address))
	if err != nil {
		fail("admin client: %v", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	if response, err := adm.CreateTopic(ctx, 3, 1, nil, *topic); err != nil || response.Err != nil {
		fail("creating %s: %v %v", *topic, err, response.Err)
	}
	codecs := map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	}
	acknowledged := 0
	for _, name := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		producer, err := kgo.NewClient(kgo.SeedBrokers(*address), kgo.ProducerBatchCompression(codecs[name]),
			kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DefaultProduceTopic(*topic))
		if err != nil {
			fail("producer: %v", err)
		}
		var records []*kgo.Record
		for i := 0; i < 100; i++ {
			records = append(records, &kgo.Record{
				Key:     []byte(fmt.Sprintf("%s-%d", name, i)),
				Value:   []byte(fmt.Sprintf("%s-value-%d", name, i)),
				Headers: []kgo.RecordHeader{{Key: "codec", Value: []byte(name)}},
			})
		}
		results := producer.ProduceSync(ctx, records...)
		if err := results.FirstErr(); err != nil {
			fail("producing with %s: %v", name, err)
		}
		acknowledged += len(results)
		producer.Close()
	}
	consumer, err := kgo.NewClient(kgo.SeedBrokers(*address), kgo.ConsumerGroup(*group), kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		fail("consumer: %v", err)
	}
	seen := map[string]int{}
	headers := 0
	read := 0
	for read < acknowledged && ctx.Err() == nil {
		fetches := consumer.PollFetches(ctx)
		fetches.EachRecord(func(record *kgo.Record) {
			read++
			seen[string(record.Value)]++
			for _, header := range record.Headers {
				if header.Key == "codec" {
					headers++
				}
			}
		})
		if err := consumer.CommitUncommittedOffsets(ctx); err != nil {
			fail("committing: %v", err)
		}
	}
	consumer.Close()
	committed, err := adm.FetchOffsets(ctx, *group)
	if err != nil {
		fail("fetching offsets: %v", err)
	}
	total := int64(0)
	committed.Each(func(offset kadm.OffsetResponse) { total += offset.At })
	out, _ := json.Marshal(map[string]any{
		"acknowledged": acknowledged, "read": read, "distinct": len(seen), "headers": headers, "committed": total,
	})
	fmt.Println(string(out))
}
