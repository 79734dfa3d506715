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
//	d  joins, five inputs (--input customers,products,orders,shipments,reviews) of JSON objects
//	   of 2–50 KB, each with its "seq": first --customers customers and --products products, all
//	   due at the start; then, at 2 : 3 : 20 : 15 : 10 of the rate (the study's 12 + 18 + 120 + 90 + 60),
//	   a customer's or product's new version (one of those ids, uniformly), a new order (of a
//	   customer and a product, uniformly: every foreign key hits), the shipment of the oldest
//	   order not yet shipped (keyed by its order's id: three orders in four get one), and a new
//	   review (of a product by a customer, uniformly). The one output is keyed by the order id,
//	   each value the order's enriched record naming the versions it joined: "order_seq",
//	   "customer_seq", "product_seq", "shipment_seq" and "review_seq" (the newest of its
//	   product's reviews). An output naming a version that is not of that order's customer,
//	   product, shipment or product's reviews is unexplained; one with the bytes of the order's
//	   previous output is a duplicate. Each input record is timed at the first output naming
//	   it, if an order it changes was sent before it (a customer, product or review no order
//	   reaches yet is named first by the order that joins it later, and timed as that order's
//	   output); every order and
//	   shipment must be seen, and every order's last output must name the last version of
//	   each of its inputs (missing counts the orders whose last output is stale too).
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
	"hash/fnv"
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
	customers   int
	products    int
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
	// Records in the schedule; record i is due at (i - preload) × interval, the first preload
	// (scenario d's customers and products) at the start.
	records  int
	preload  int
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
	// Scenario d: each record's input and fields, and the last version of each customer and
	// product, each order's shipment and each product's newest review (-1: none); per order the
	// hash of its last output and whether it names those; per record whether an output named it.
	joined       []joinedRecord
	lastCustomer []int32
	lastProduct  []int32
	newestReview []int32
	lastOutput   map[int32]uint64
	final        map[int32]bool
	finalOrders  atomic.Int64
	orders       int64
	named        []bool
	retractions  atomic.Int64

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

// Scenario d's inputs, in --input's order, and their shares of the rate after the preload.
const (
	inputCustomers = iota
	inputCatalog
	inputPurchases
	inputShipments
	inputReviews
)

var joinShares = [5]int{2, 3, 20, 15, 10}

// joinedRecord is one record of scenario d: its input, size and fields (customer and product
// numbers; a shipment's order record; a review's stars).
type joinedRecord struct {
	input    uint8
	stars    uint8
	size     uint16
	customer int32
	product  int32
	// A shipment's order (a record number); an order's shipment (-1: none).
	other int32
	// Whether an order was sent before it that it changes (a customer or product version, a
	// review of the product): only then is it timed, at the first output naming it. A version
	// no order reaches yet is named first by the order that later joins it, which is timed.
	reaches bool
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
	flags.StringVar(&settings.scenario, "scenario", "a", "a (stateless), b (word count), c (routing) or d (joins)")
	flags.StringVar(&settings.mode, "mode", "eos", "eos (the consumer reads read_committed) or alo")
	flags.StringVar(&settings.input, "input", "", "the input topic (c: users,products,orders,clicks; d: customers,products,orders,shipments,reviews)")
	flags.StringVar(&settings.outputs, "outputs", "", "the output topics, comma-separated")
	flags.StringVar(&settings.countFormat, "count-format", "long", "scenario b's count: long or json")
	flags.Float64Var(&settings.rate, "rate", 5000, "input records per second")
	flags.IntVar(&settings.keys, "keys", 10000, "distinct record keys")
	flags.IntVar(&settings.words, "words", 1000, "scenario b's vocabulary")
	flags.IntVar(&settings.customers, "customers", 1000, "scenario d's customers")
	flags.IntVar(&settings.products, "products", 500, "scenario d's products")
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
	case "d":
		if len(strings.Split(settings.input, ",")) != 5 || len(strings.Split(settings.outputs, ",")) != 1 {
			fail("scenario d reads five inputs (customers,products,orders,shipments,reviews) and one output")
		}
		if settings.customers < 1 || settings.products < 1 {
			fail("scenario d needs at least one customer and one product")
		}
	default:
		fail("--scenario is a, b, c or d, not %q", settings.scenario)
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
		done:         make(chan struct{}),
	}
	if settings.scenario == "d" {
		run.preload = settings.customers + settings.products
	}
	run.first = run.preload + int(settings.warmup/interval)
	run.end = run.preload + int((settings.warmup+settings.measure)/interval)
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
	case "d":
		run.joinSchedule(random)
	}
	return run
}

// joinSchedule draws scenario d's records and what each order's last output must name.
func (run *streamsRun) joinSchedule(random *rand.Rand) {
	run.joined = make([]joinedRecord, run.records)
	run.named = make([]bool, run.records)
	run.lastCustomer = make([]int32, run.settings.customers)
	run.lastProduct = make([]int32, run.settings.products)
	run.newestReview = make([]int32, run.settings.products)
	for i := range run.newestReview {
		run.newestReview[i] = -1
	}
	run.lastOutput = make(map[int32]uint64)
	run.final = make(map[int32]bool)
	total := 0
	for _, share := range joinShares {
		total += share
	}
	var unshipped []int32
	ordered := [2][]bool{make([]bool, run.settings.customers), make([]bool, run.settings.products)}
	for i := range run.joined {
		record := &run.joined[i]
		record.other = -1
		// 2–50 KB, log-uniform.
		record.size = uint16(2048 * math.Pow(25, random.Float64()))
		switch {
		case i < run.settings.customers:
			record.input, record.customer = inputCustomers, int32(i)
		case i < run.preload:
			record.input, record.product = inputCatalog, int32(i-run.settings.customers)
		default:
			pick := random.Intn(total)
			for record.input = 0; pick >= joinShares[record.input]; record.input++ {
				pick -= joinShares[record.input]
			}
			if record.input == inputShipments && len(unshipped) == 0 {
				record.input = inputPurchases
			}
			record.customer = int32(random.Intn(run.settings.customers))
			record.product = int32(random.Intn(run.settings.products))
			record.stars = uint8(1 + random.Intn(5))
		}
		switch record.input {
		case inputCustomers:
			run.lastCustomer[record.customer] = int32(i)
			record.reaches = ordered[0][record.customer]
		case inputCatalog:
			run.lastProduct[record.product] = int32(i)
			record.reaches = ordered[1][record.product]
		case inputPurchases:
			ordered[0][record.customer], ordered[1][record.product] = true, true
			record.reaches = true
			unshipped = append(unshipped, int32(i))
			run.orders++
			run.expected++
		case inputShipments:
			record.other, unshipped = unshipped[0], unshipped[1:]
			run.joined[record.other].other = int32(i)
			record.reaches = true
			run.expected++
		case inputReviews:
			run.newestReview[record.product] = int32(i)
			record.reaches = ordered[1][record.product]
		}
	}
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
	case run.settings.scenario == "d":
		return run.joinedValue(i)
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
	return withPayload(value, i, int(route.size))
}

// withPayload ends record i's JSON with a payload of random letters to its size.
func withPayload(value []byte, i, size int) []byte {
	value = append(value, `,"payload":"`...)
	if fill := size - len(value) - 2; fill > 0 {
		offset := (i * 7919) % (len(letters) - fill)
		value = append(value, letters[offset:offset+fill]...)
	}
	return append(value, `"}`...)
}

// joinedValue is scenario d's record i: its fields, then a payload to its size.
func (run *streamsRun) joinedValue(i int) []byte {
	record := &run.joined[i]
	value := make([]byte, 0, int(record.size)+16)
	value = append(value, `{"seq":`...)
	value = strconv.AppendInt(value, int64(i), 10)
	switch record.input {
	case inputCustomers:
		value = fmt.Appendf(value, `,"kind":"customer","name":"name%d","tier":%d`, i, i%3)
	case inputCatalog:
		value = fmt.Appendf(value, `,"kind":"product","title":"title%d","price":%d`, i, 1+i%997)
	case inputPurchases:
		value = fmt.Appendf(value, `,"kind":"order","customer":"c%d","product":"p%d","amount":%d`,
			record.customer, record.product, 1+i%9)
	case inputShipments:
		value = fmt.Appendf(value, `,"kind":"shipment","order":"o%d","carrier":"carrier%d","status":"shipped"`,
			record.other, i%5)
	default:
		value = fmt.Appendf(value, `,"kind":"review","product":"p%d","customer":"c%d","stars":%d`,
			record.product, record.customer, record.stars)
	}
	return withPayload(value, i, int(record.size))
}

// key is record i's key: scenario c's entity, or one of --keys.
func (run *streamsRun) key(i int) []byte {
	if run.settings.scenario == "d" {
		record := &run.joined[i]
		switch record.input {
		case inputCustomers:
			return []byte("c" + strconv.Itoa(int(record.customer)))
		case inputCatalog:
			return []byte("p" + strconv.Itoa(int(record.product)))
		case inputShipments:
			return []byte("o" + strconv.Itoa(int(record.other)))
		case inputReviews:
			return []byte("r" + strconv.Itoa(i))
		}
		return []byte("o" + strconv.Itoa(i))
	}
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

// due is when record i is due, from the run's start.
func (run *streamsRun) due(i int) time.Duration {
	if i < run.preload {
		return 0
	}
	return time.Duration(i-run.preload) * run.interval
}

// produce sends the schedule: every record due by now, then sleeps until the next is due.
func (run *streamsRun) produce(producer *kgo.Client) {
	measuring, halfway := false, false
	for i := 0; i < run.records; {
		if wait := run.due(i) - time.Since(run.start); wait > 0 {
			time.Sleep(wait)
		}
		for now := time.Since(run.start); i < run.records && run.due(i) <= now; i++ {
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
				Timestamp: run.start.Add(run.due(i)),
			}
			switch run.settings.scenario {
			case "c":
				record.Topic = run.inputTopics[run.routes[i].input]
			case "d":
				record.Topic = run.inputTopics[run.joined[i].input]
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
			if run.settings.scenario == "d" {
				latencies = run.joinedOutput(record, at, latencies)
				return
			}
			if source, ok := run.source(record); ok {
				run.lastReceipt.Store(int64(at))
				if run.inWindow(at) {
					run.receivedIn.Add(1)
				}
				if source >= run.first && source < run.end {
					latencies = append(latencies, at-run.due(source))
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

// joinedOutput checks one output of scenario d (see the top of this file) and times the input
// records it names for the first time. One consumer goroutine calls it.
func (run *streamsRun) joinedOutput(record *kgo.Record, at time.Duration, latencies []time.Duration) []time.Duration {
	order, err := strconv.Atoi(strings.TrimPrefix(string(record.Key), "o"))
	if err != nil || !strings.HasPrefix(string(record.Key), "o") || order < 0 || order >= run.records ||
		run.joined[order].input != inputPurchases {
		run.unexplained(record)
		return latencies
	}
	var fields struct {
		Removed     bool   `json:"removed"`
		OrderSeq    *int32 `json:"order_seq"`
		CustomerSeq *int32 `json:"customer_seq"`
		ProductSeq  *int32 `json:"product_seq"`
		ShipmentSeq *int32 `json:"shipment_seq"`
		ReviewSeq   *int32 `json:"review_seq"`
	}
	key := int32(order)
	if record.Value == nil || (json.Unmarshal(record.Value, &fields) == nil && fields.Removed) {
		// A join that no longer holds: the order's record is gone until it holds again.
		run.retractions.Add(1)
		run.setFinal(key, false)
		delete(run.lastOutput, key)
		return latencies
	}
	if json.Unmarshal(record.Value, &fields) != nil || fields.OrderSeq == nil || *fields.OrderSeq != key ||
		fields.CustomerSeq == nil || fields.ProductSeq == nil {
		run.unexplained(record)
		return latencies
	}
	purchase := &run.joined[order]
	is := func(seq int32, input uint8, ok func(*joinedRecord) bool) bool {
		return seq >= 0 && int(seq) < run.records && run.joined[seq].input == input && ok(&run.joined[seq])
	}
	orNone := func(seq *int32) int32 {
		if seq == nil {
			return -1
		}
		return *seq
	}
	shipment, review := orNone(fields.ShipmentSeq), orNone(fields.ReviewSeq)
	if !is(*fields.CustomerSeq, inputCustomers, func(r *joinedRecord) bool { return r.customer == purchase.customer }) ||
		!is(*fields.ProductSeq, inputCatalog, func(r *joinedRecord) bool { return r.product == purchase.product }) ||
		(shipment >= 0 && shipment != purchase.other) ||
		(review >= 0 && !is(review, inputReviews, func(r *joinedRecord) bool { return r.product == purchase.product })) {
		run.unexplained(record)
		return latencies
	}
	hash := fnv.New64a()
	hash.Write(record.Value)
	sum := hash.Sum64()
	if previous, ok := run.lastOutput[key]; ok && previous == sum {
		run.duplicate.Add(1)
		return latencies
	}
	run.lastOutput[key] = sum
	run.lastReceipt.Store(int64(at))
	if run.inWindow(at) {
		run.receivedIn.Add(1)
	}
	for _, seq := range []int32{key, *fields.CustomerSeq, *fields.ProductSeq, shipment, review} {
		if seq < 0 || run.named[seq] {
			continue
		}
		run.named[seq] = true
		if input := run.joined[seq].input; input == inputPurchases || input == inputShipments {
			run.received.Add(1)
		}
		if int(seq) >= run.first && int(seq) < run.end && run.joined[seq].reaches {
			latencies = append(latencies, at-run.due(int(seq)))
		}
	}
	run.setFinal(key, *fields.CustomerSeq == run.lastCustomer[purchase.customer] &&
		*fields.ProductSeq == run.lastProduct[purchase.product] && shipment == purchase.other &&
		review == run.newestReview[purchase.product])
	if run.received.Load() == run.expected && run.finalOrders.Load() == run.orders {
		run.finish()
	}
	return latencies
}

// unexplained counts an output of scenario d the input does not explain, and logs the first few.
func (run *streamsRun) unexplained(record *kgo.Record) {
	if run.unknown.Add(1) <= 3 {
		logf("unexplained output %s: key %q, value %.300s", record.Topic, record.Key, record.Value)
	}
}

// setFinal records whether an order's last output names the last version of each input.
func (run *streamsRun) setFinal(order int32, final bool) {
	if run.final[order] != final {
		run.final[order] = final
		if final {
			run.finalOrders.Add(1)
		} else {
			run.finalOrders.Add(-1)
		}
	}
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
			line := fmt.Sprintf("scenario %s: %d of %d sent, %d of %d outputs, %d duplicates", run.settings.scenario,
				run.sent.Load(), run.records, run.received.Load(), run.expected, run.duplicate.Load())
			if run.settings.scenario == "d" {
				line += fmt.Sprintf(", %d of %d orders final", run.finalOrders.Load(), run.orders)
			}
			logf("%s", line)
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
	missing := run.expected - run.received.Load()
	// Scenario d: an order whose last output is not its final join is missing its last change.
	stale := run.orders - run.finalOrders.Load()
	out, _ := json.Marshal(map[string]any{
		"stale":            stale,
		"retractions":      run.retractions.Load(),
		"scenario":         run.settings.scenario,
		"mode":             run.settings.mode,
		"rate":             run.settings.rate,
		"records":          run.records,
		"sent":             run.sent.Load(),
		"send_failures":    run.failed.Load(),
		"expected":         run.expected,
		"received":         run.received.Load(),
		"missing":          missing + stale,
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
