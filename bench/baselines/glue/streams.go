// streams: study 5's generator and latency consumer (`onehop bench streams`), the same program
// for every side, so both are fed the same input and timed on one clock.
//
// The generator sends each scenario's input through the Kafka protocol, open loop at --rate:
// record i is due at i/rate after the run starts, its timestamp is that moment (epoch ms), and
// a record sent late is timed from when it was due, so a side that falls behind shows it in
// its latency. The consumer reads the output topics from their start (read_committed with
// --mode eos) and times each output from the moment the input record that made it was due to
// its receipt:
//
//	a  the value is "<seq> <words…>" (1 KB) or a word of 1–5 letters (one record in ten); the
//	   output is the long ones upper-cased, and the seq in front says which record it is.
//	b  the value is a sentence of lowercase words, one space apart; the output is every
//	   changed count of a word, key the word, value the count (--count-format long: 8 bytes
//	   big-endian, as Kafka Streams' Long serde; json: an object with "count", as onehop's view
//	   change stream). The n-th count of a word is timed from the sentence holding the word's
//	   n-th occurrence.
//	c  routing, four inputs (--input users,products,orders,clicks, 3 : 2 : 1 : 4 of the rate):
//	   JSON objects of 2–30 KB (log-uniform; a payload of random letters fills them), each with
//	   its "seq". Path A: a user event or product update holds a "priority" (high, medium,
//	   low) and 1–4 distinct "tags"; each tag is one output, keyed by the tag, holding "seq"
//	   and "tag", in the output of its priority (--outputs high,medium,low,customers). Path B:
//	   an order whose "status" is not "cancelled" (one in ten is) and a click whose "bot" is
//	   false (one in five is true) is one output, the record itself keyed by its "customer",
//	   in the fourth output. An output in the wrong output or under the wrong key is
//	   unexplained.
//
// What it prints on stdout, for the harness: "phase measure" when the measured window begins,
// "phase half" in its middle (where a --kill run kills the processing side), "phase drain"
// when the last record is sent, then one JSON line with the figures: the
// latencies of the outputs of records due in the measured window, and the rates kept in it
// (sends acknowledged and outputs received in the window, per second). Progress goes to
// stderr every 2 s.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type streamsSettings struct {
	address     string
	scenario    string
	mode        string
	input       string
	outputs     string
	countFormat string
	rate        float64
	keys        int
	words       int
	warmup      time.Duration
	measure     time.Duration
	drain       time.Duration
	seed        int64
}

// streamsRun is one run: the schedule (fixed before the first send), and what came out.
type streamsRun struct {
	settings *streamsSettings
	// The input and output topics, as --input and --outputs list them.
	inputTopics, outputTopics []string
	// Records in the schedule; record i is due at i × interval.
	records  int
	interval time.Duration
	// The measured window, as record numbers: [first, end).
	first, end int
	start      time.Time

	// Scenario a: whether record i is long (expected in the output).
	long []bool
	// Scenario b: each sentence, and per word the records holding its occurrences, in order.
	sentences   []string
	occurrences map[string][]int32
	// Scenario c: each record's input, size, entity (user, product or customer number),
	// priority and tags (path A) or whether the filter keeps it (path B); and per record the
	// outputs seen, a bit per tag (path B: bit 0). One consumer goroutine writes seenMask.
	routes   []routed
	seenMask []uint8

	// What the consumer saw: scenario a per record, scenario b per word and count.
	seen      []atomic.Bool
	counts    map[string][]bool
	expected  int64
	received  atomic.Int64
	duplicate atomic.Int64
	unknown   atomic.Int64
	// over counts the counts above the number of times their word was sent: what an
	// at-least-once count does after a crash, counting replayed input again.
	over    atomic.Int64
	sent    atomic.Int64
	failed  atomic.Int64
	outputs atomic.Int64

	mu        sync.Mutex
	latencies []time.Duration
	// Acknowledged sends and received outputs within the measured window, by when each
	// happened: the rates kept.
	ackedIn     atomic.Int64
	receivedIn  atomic.Int64
	lastReceipt atomic.Int64
	done        chan struct{}
	closeOnce   sync.Once
}

// Scenario c's inputs, in --input's order, and their shares of the rate.
const (
	inputUsers = iota
	inputProducts
	inputOrders
	inputClicks
)

var routingShares = [4]int{3, 2, 1, 4}

// The outputs of scenario c, in --outputs' order: path A's by priority, then path B's.
var priorities = [3]string{"high", "medium", "low"}

const customersOutput = 3

// routed is one record of scenario c.
type routed struct {
	input    uint8
	priority uint8
	// Path A: the tags (numbers, rendered "tag<n>"); path B: tags is empty.
	tags   []uint8
	kept   bool
	size   uint16
	entity int32
}

// letters is random lowercase text that scenario c's payloads are windows of: snappy and lz4
// find nothing to compress in it, as in real, varied payloads.
var letters = func() []byte {
	random := rand.New(rand.NewSource(3))
	text := make([]byte, 64<<10)
	for i := range text {
		text[i] = byte('a' + random.Intn(26))
	}
	return text
}()

func streamsStudy(args []string) {
	var settings streamsSettings
	flags := flag.NewFlagSet("streams", flag.ExitOnError)
	flags.StringVar(&settings.address, "address", "", "bootstrap brokers (host:port, comma-separated)")
	flags.StringVar(&settings.scenario, "scenario", "a", "a (stateless), b (word count) or c (routing)")
	flags.StringVar(&settings.mode, "mode", "eos", "eos (the consumer reads read_committed) or alo")
	flags.StringVar(&settings.input, "input", "", "the input topic (c: users,products,orders,clicks)")
	flags.StringVar(&settings.outputs, "outputs", "", "the output topics, comma-separated")
	flags.StringVar(&settings.countFormat, "count-format", "long", "scenario b's count: long or json")
	flags.Float64Var(&settings.rate, "rate", 5000, "input records per second")
	flags.IntVar(&settings.keys, "keys", 10000, "distinct record keys")
	flags.IntVar(&settings.words, "words", 1000, "scenario b's vocabulary")
	flags.DurationVar(&settings.warmup, "warmup", 20*time.Second, "sent before the measured window")
	flags.DurationVar(&settings.measure, "measure", 60*time.Second, "the measured window")
	flags.DurationVar(&settings.drain, "drain", 60*time.Second, "longest wait for outputs after the last send")
	flags.Int64Var(&settings.seed, "seed", 5, "the input's random seed")
	flags.Parse(args)
	if settings.address == "" || settings.input == "" || settings.outputs == "" || settings.rate <= 0 {
		fail("streams needs --address, --input, --outputs and a positive --rate")
	}
	switch settings.scenario {
	case "a", "b":
	case "c":
		if len(strings.Split(settings.input, ",")) != 4 || len(strings.Split(settings.outputs, ",")) != 4 {
			fail("scenario c reads four inputs (users,products,orders,clicks) and four outputs (high,medium,low,customers)")
		}
	default:
		fail("--scenario is a, b or c, not %q", settings.scenario)
	}
	run := newStreamsRun(&settings)
	logf("scenario %s: %d records at %.0f/s (%s warm-up, %s measured), %d outputs expected",
		settings.scenario, run.records, settings.rate, settings.warmup, settings.measure, run.expected)

	consumer := run.consumer()
	defer consumer.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(settings.address, ",")...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.DefaultProduceTopic(strings.Split(settings.input, ",")[0]), kgo.MaxBufferedRecords(1<<16),
		kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		fail("producer: %v", err)
	}
	defer producer.Close()
	go run.consume(consumer)
	go run.progress()

	run.start = time.Now()
	run.produce(producer)
	fmt.Println("phase drain")
	if err := producer.Flush(context.Background()); err != nil {
		logf("flush: %v", err)
	}
	select {
	case <-run.done:
	case <-time.After(settings.drain):
		logf("drain: %d of %d outputs after %s", run.received.Load(), run.expected, settings.drain)
	}
	run.finish()
	run.report()
}

func newStreamsRun(settings *streamsSettings) *streamsRun {
	interval := time.Duration(float64(time.Second) / settings.rate)
	run := &streamsRun{
		settings:     settings,
		inputTopics:  strings.Split(settings.input, ","),
		outputTopics: strings.Split(settings.outputs, ","),
		interval:     interval,
		first:        int(settings.warmup / interval),
		end:          int((settings.warmup + settings.measure) / interval),
		done:         make(chan struct{}),
	}
	run.records = run.end
	random := rand.New(rand.NewSource(settings.seed))
	switch settings.scenario {
	case "a":
		run.long = make([]bool, run.records)
		for i := range run.long {
			run.long[i] = random.Intn(10) != 0
			if run.long[i] {
				run.expected++
			}
		}
		run.seen = make([]atomic.Bool, run.records)
	case "b":
		vocabulary := make([]string, settings.words)
		for i := range vocabulary {
			vocabulary[i] = pseudoWord(random, i)
		}
		run.occurrences = make(map[string][]int32, len(vocabulary))
		run.sentences = make([]string, run.records)
		var sentence strings.Builder
		for i := range run.sentences {
			// 50–1 000 bytes, about 200 on average.
			length := 50 + int(math.Min(950, random.ExpFloat64()*150))
			sentence.Reset()
			for sentence.Len() < length {
				// A Zipf-like choice: some words much more frequent than others.
				word := vocabulary[int(float64(len(vocabulary))*math.Pow(random.Float64(), 2))]
				if sentence.Len() > 0 {
					sentence.WriteByte(' ')
				}
				sentence.WriteString(word)
				run.occurrences[word] = append(run.occurrences[word], int32(i))
				run.expected++
			}
			run.sentences[i] = sentence.String()
		}
		run.counts = make(map[string][]bool, len(run.occurrences))
		for word, records := range run.occurrences {
			run.counts[word] = make([]bool, len(records))
		}
	case "c":
		run.routes = make([]routed, run.records)
		run.seenMask = make([]uint8, run.records)
		total := 0
		for _, share := range routingShares {
			total += share
		}
		for i := range run.routes {
			route := &run.routes[i]
			pick := random.Intn(total)
			for route.input = 0; pick >= routingShares[route.input]; route.input++ {
				pick -= routingShares[route.input]
			}
			// 2–30 KB, log-uniform.
			route.size = uint16(2048 * math.Pow(15, random.Float64()))
			switch route.input {
			case inputUsers, inputProducts:
				route.entity = int32(random.Intn(settings.keys))
				route.priority = uint8([]int{0, 1, 1, 2, 2, 2, 2, 2, 2, 2}[random.Intn(10)])
				count := 1 + random.Intn(4)
				for len(route.tags) < count {
					tag := uint8(random.Intn(64))
					if !slices.Contains(route.tags, tag) {
						route.tags = append(route.tags, tag)
					}
				}
				run.expected += int64(count)
			default:
				route.entity = int32(random.Intn(settings.keys))
				if route.input == inputOrders {
					route.kept = random.Intn(10) != 0
				} else {
					route.kept = random.Intn(5) != 0
				}
				if route.kept {
					run.expected++
				}
			}
		}
	}
	return run
}

// pseudoWord is vocabulary word i: 3–10 lowercase letters, unique by its suffix.
func pseudoWord(random *rand.Rand, i int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	length := 2 + random.Intn(7)
	word := make([]byte, 0, length+3)
	for j := 0; j < length; j++ {
		word = append(word, letters[random.Intn(len(letters))])
	}
	for n := i; ; n /= 26 {
		word = append(word, letters[n%26])
		if n < 26 {
			break
		}
	}
	return string(word)
}

// filler is the text after scenario a's seq: lowercase words to 1 KB.
var filler = func() string {
	var text strings.Builder
	random := rand.New(rand.NewSource(1))
	for text.Len() < 1024 {
		text.WriteByte(' ')
		text.WriteString(pseudoWord(random, text.Len()))
	}
	return text.String()
}()

func (run *streamsRun) value(i int) []byte {
	switch {
	case run.settings.scenario == "c":
		return run.routedValue(i)
	case run.settings.scenario == "b":
		return []byte(run.sentences[i])
	case run.long[i]:
		head := strconv.Itoa(i)
		return []byte(head + filler[:1024-len(head)])
	default:
		return []byte("abcde"[:1+i%5])
	}
}

// routedValue is scenario c's record i: its fields, then a payload to its size.
func (run *streamsRun) routedValue(i int) []byte {
	route := &run.routes[i]
	value := make([]byte, 0, int(route.size)+16)
	value = append(value, `{"seq":`...)
	value = strconv.AppendInt(value, int64(i), 10)
	switch route.input {
	case inputUsers, inputProducts:
		if route.input == inputUsers {
			value = append(value, `,"kind":"user","user":"u`...)
		} else {
			value = append(value, `,"kind":"product","sku":"p`...)
		}
		value = strconv.AppendInt(value, int64(route.entity), 10)
		value = append(value, `","priority":"`...)
		value = append(value, priorities[route.priority]...)
		value = append(value, `","tags":[`...)
		for n, tag := range route.tags {
			if n > 0 {
				value = append(value, ',')
			}
			value = append(value, `"tag`...)
			value = strconv.AppendInt(value, int64(tag), 10)
			value = append(value, '"')
		}
		value = append(value, ']')
	case inputOrders:
		value = append(value, `,"kind":"order","customer":"c`...)
		value = strconv.AppendInt(value, int64(route.entity), 10)
		value = append(value, `","status":"`...)
		if route.kept {
			value = append(value, `placed"`...)
		} else {
			value = append(value, `cancelled"`...)
		}
		value = append(value, `,"amount":`...)
		value = strconv.AppendInt(value, int64(10+i%990), 10)
	default:
		value = append(value, `,"kind":"click","customer":"c`...)
		value = strconv.AppendInt(value, int64(route.entity), 10)
		value = append(value, `","page":"/p/`...)
		value = strconv.AppendInt(value, int64(i%500), 10)
		value = append(value, `","bot":`...)
		value = strconv.AppendBool(value, !route.kept)
	}
	value = append(value, `,"payload":"`...)
	if fill := int(route.size) - len(value) - 2; fill > 0 {
		offset := (i * 7919) % (len(letters) - fill)
		value = append(value, letters[offset:offset+fill]...)
	}
	return append(value, `"}`...)
}

// key is record i's key: scenario c's entity, or one of --keys.
func (run *streamsRun) key(i int) []byte {
	if run.settings.scenario != "c" {
		return []byte("k" + strconv.Itoa(i%run.settings.keys))
	}
	route := &run.routes[i]
	prefix := [4]string{"u", "p", "o", "c"}[route.input]
	if route.input == inputOrders {
		return []byte(prefix + strconv.Itoa(i))
	}
	return []byte(prefix + strconv.Itoa(int(route.entity)))
}

// produce sends the schedule: every record due by now, then sleeps until the next is due.
func (run *streamsRun) produce(producer *kgo.Client) {
	measuring, halfway := false, false
	for i := 0; i < run.records; {
		due := time.Duration(i) * run.interval
		if wait := due - time.Since(run.start); wait > 0 {
			time.Sleep(wait)
		}
		for now := time.Since(run.start); i < run.records && time.Duration(i)*run.interval <= now; i++ {
			if !measuring && i >= run.first {
				measuring = true
				fmt.Println("phase measure")
			}
			if !halfway && i >= (run.first+run.end)/2 {
				halfway = true
				fmt.Println("phase half")
			}
			record := &kgo.Record{
				Key:       run.key(i),
				Value:     run.value(i),
				Timestamp: run.start.Add(time.Duration(i) * run.interval),
			}
			if run.settings.scenario == "c" {
				record.Topic = run.inputTopics[run.routes[i].input]
			}
			producer.Produce(context.Background(), record, func(_ *kgo.Record, err error) {
				if err != nil {
					if run.failed.Add(1) <= 5 {
						logf("send failed: %v", err)
					}
					return
				}
				run.sent.Add(1)
				if run.inWindow(time.Since(run.start)) {
					run.ackedIn.Add(1)
				}
			})
		}
	}
}

// inWindow says whether a moment of the run falls in the measured window.
func (run *streamsRun) inWindow(at time.Duration) bool {
	return at >= run.settings.warmup && at < run.settings.warmup+run.settings.measure
}

func (run *streamsRun) consumer() *kgo.Client {
	options := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(run.settings.address, ",")...),
		kgo.ConsumeTopics(strings.Split(run.settings.outputs, ",")...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
	if run.settings.mode == "eos" {
		options = append(options, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	consumer, err := kgo.NewClient(options...)
	if err != nil {
		fail("consumer: %v", err)
	}
	return consumer
}

func (run *streamsRun) consume(consumer *kgo.Client) {
	var latencies []time.Duration
	for {
		fetches := consumer.PollFetches(context.Background())
		at := time.Since(run.start)
		if fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			logf("fetch %s/%d: %v", topic, partition, err)
		})
		fetches.EachRecord(func(record *kgo.Record) {
			run.outputs.Add(1)
			if source, ok := run.source(record); ok {
				run.lastReceipt.Store(int64(at))
				if run.inWindow(at) {
					run.receivedIn.Add(1)
				}
				if source >= run.first && source < run.end {
					latencies = append(latencies, at-time.Duration(source)*run.interval)
				}
				if run.received.Add(1) == run.expected {
					run.finish()
				}
			}
		})
		if len(latencies) > 4096 {
			run.keep(latencies)
			latencies = latencies[:0]
		}
		if run.stopped() {
			break
		}
	}
	run.keep(latencies)
}

// source is the input record an output came from, once per output; false for a duplicate or
// an output the schedule does not explain.
func (run *streamsRun) source(record *kgo.Record) (int, bool) {
	if run.settings.scenario == "c" {
		return run.routedSource(record)
	}
	if run.settings.scenario == "a" {
		head := record.Value
		if space := strings.IndexByte(string(head[:min(len(head), 16)]), ' '); space > 0 {
			head = head[:space]
		}
		i, err := strconv.Atoi(string(head))
		if err != nil || i < 0 || i >= run.records || !run.long[i] {
			run.unknown.Add(1)
			return 0, false
		}
		if run.seen[i].Swap(true) {
			run.duplicate.Add(1)
			return 0, false
		}
		return i, true
	}
	word := string(record.Key)
	count, ok := run.count(record.Value)
	records := run.occurrences[word]
	if !ok || count < 1 {
		run.unknown.Add(1)
		return 0, false
	}
	if count > int64(len(records)) {
		run.over.Add(1)
		return 0, false
	}
	// One consumer goroutine writes these.
	seen := run.counts[word]
	if seen[count-1] {
		run.duplicate.Add(1)
		return 0, false
	}
	seen[count-1] = true
	return int(records[count-1]), true
}

// routedSource is source for scenario c: the record the output names by its "seq", if it is
// one of that record's outputs, in its output and under its key, seen for the first time.
func (run *streamsRun) routedSource(record *kgo.Record) (int, bool) {
	var fields struct {
		Seq *int    `json:"seq"`
		Tag *string `json:"tag"`
	}
	output := slices.Index(run.outputTopics, record.Topic)
	if json.Unmarshal(record.Value, &fields) != nil || fields.Seq == nil || *fields.Seq < 0 || *fields.Seq >= run.records || output < 0 {
		run.unknown.Add(1)
		return 0, false
	}
	i := *fields.Seq
	route := &run.routes[i]
	bit := -1
	switch {
	case len(route.tags) > 0 && fields.Tag != nil && output == int(route.priority) && string(record.Key) == *fields.Tag:
		for n, tag := range route.tags {
			if *fields.Tag == "tag"+strconv.Itoa(int(tag)) {
				bit = n
			}
		}
	case len(route.tags) == 0 && route.kept && output == customersOutput &&
		string(record.Key) == "c"+strconv.Itoa(int(route.entity)):
		bit = 0
	}
	if bit < 0 {
		run.unknown.Add(1)
		return 0, false
	}
	if run.seenMask[i]&(1<<bit) != 0 {
		run.duplicate.Add(1)
		return 0, false
	}
	run.seenMask[i] |= 1 << bit
	return i, true
}

func (run *streamsRun) count(value []byte) (int64, bool) {
	if run.settings.countFormat == "long" {
		if len(value) != 8 {
			return 0, false
		}
		return int64(binary.BigEndian.Uint64(value)), true
	}
	var row struct {
		Count *int64 `json:"count"`
	}
	if json.Unmarshal(value, &row) != nil || row.Count == nil {
		return 0, false
	}
	return *row.Count, true
}

func (run *streamsRun) keep(latencies []time.Duration) {
	run.mu.Lock()
	run.latencies = append(run.latencies, latencies...)
	run.mu.Unlock()
}

func (run *streamsRun) finish() {
	run.closeOnce.Do(func() { close(run.done) })
}

func (run *streamsRun) stopped() bool {
	select {
	case <-run.done:
		return true
	default:
		return false
	}
}

func (run *streamsRun) progress() {
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-run.done:
			return
		case <-ticker.C:
			logf("scenario %s: %d of %d sent, %d of %d outputs, %d duplicates", run.settings.scenario,
				run.sent.Load(), run.records, run.received.Load(), run.expected, run.duplicate.Load())
		}
	}
}

// The percentiles the CDF plots are drawn through.
var cdfPoints = []float64{1, 5, 10, 25, 50, 75, 90, 95, 98, 99, 99.5, 99.9, 99.95, 99.99, 100}

func (run *streamsRun) report() {
	// The consumer may still be appending its last batch.
	time.Sleep(200 * time.Millisecond)
	run.mu.Lock()
	latencies := append([]time.Duration(nil), run.latencies...)
	run.mu.Unlock()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	percentile := func(p float64) float64 { return percentileMs(latencies, p/100) }
	cdf := make([][2]float64, 0, len(cdfPoints))
	for _, p := range cdfPoints {
		cdf = append(cdf, [2]float64{p, percentile(p)})
	}
	measured := run.settings.measure.Seconds()
	out, _ := json.Marshal(map[string]any{
		"scenario":         run.settings.scenario,
		"mode":             run.settings.mode,
		"rate":             run.settings.rate,
		"records":          run.records,
		"sent":             run.sent.Load(),
		"send_failures":    run.failed.Load(),
		"expected":         run.expected,
		"received":         run.received.Load(),
		"missing":          run.expected - run.received.Load(),
		"duplicates":       run.duplicate.Load(),
		"unexplained":      run.unknown.Load(),
		"overcounts":       run.over.Load(),
		"output_records":   run.outputs.Load(),
		"measured_outputs": len(latencies),
		"input_per_s":      float64(run.ackedIn.Load()) / measured,
		"output_per_s":     float64(run.receivedIn.Load()) / measured,
		"last_receipt_s":   time.Duration(run.lastReceipt.Load()).Seconds(),
		"p50_ms":           percentile(50),
		"p95_ms":           percentile(95),
		"p99_ms":           percentile(99),
		"p999_ms":          percentile(99.9),
		"max_ms":           percentile(100),
		"cdf":              cdf,
		"schedule_seconds": (run.settings.warmup + run.settings.measure).Seconds(),
		"warmup_seconds":   run.settings.warmup.Seconds(),
		"measured_seconds": measured,
	})
	fmt.Println(string(out))
}
