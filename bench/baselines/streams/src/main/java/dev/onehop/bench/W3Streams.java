// onehop-peer-streams: study 1's W3 on the conventional stack, a Kafka Streams application.
//
// A count per key in tumbling windows (5 s, grace 1 s) over one input topic, written as a Kafka
// Streams user would: the windowed KTable's changelog goes to `<topic>-changes` (every update of
// a window's count), its suppress(untilWindowCloses) to `<topic>-finals` (one final count per
// window, once stream time passes the window's end plus grace), and the window store is served
// to point queries through Interactive Queries over HTTP.
//
// The harness (crates/bench/src/target/peers/kafka_streams.rs) starts one per run. The app
// creates its topics, starts Kafka Streams and waits until it is RUNNING, starts its HTTP
// server and its consumer of the two output topics, waits until a first record (a tick, see
// below) has come through the whole pipeline, then opens two connections to the harness:
//
//   produce: first line "produce"; the harness writes "P <seq> <intended_ns> <key> <event_ms>\n"
//            per event, and the app's producer sends the record (key <key>, timestamp <event_ms>,
//            value {"seq":…,"event_ms":…}) and answers "A <seq>\n" once Kafka acknowledged it
//            (acks=1), or "F <seq> <reason>\n".
//   observe: first line "observe"; the app writes "W c <key> <window_start_ms> <count>\n" for
//            every record its consumer reads from the changelog topic and "W f …" for every
//            record of the suppressed topic. The harness stamps each line when its bytes reach
//            its socket.
//
//   GET /views/<any>/<key>  the key's windows in the store: 200 {"key","rows":[{window_start,
//                           window_end, n}…]}, or 404 when the store holds none for the key.
//   GET /healthz            200, for the harness's connection warm-up.
//
// Stream time only moves with records: after the last event nothing would close the last
// windows. So once the harness has sent at least one event, a record with key "__tick" and the
// wall clock's time goes to the input topic whenever no event was produced for TICK_IDLE_MS, as
// a live topic keeps receiving records; ticks are counted like any key and never reported. At
// the workload's 100 events/s they are sent only after the schedule's end.
//
// The app reads no clock for the figures. usage: W3Streams version | W3Streams --brokers … (see
// parseFlags).
package dev.onehop.bench;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

public final class W3Streams {
    /** The window store Interactive Queries read. */
    static final String STORE = "w3-counts";
    /** The key of the records that keep stream time at the wall clock once events stop. */
    static final String TICK_KEY = "__tick";
    /** How long the input may be idle before a tick is sent, and how often the ticker looks. */
    static final long TICK_IDLE_MS = 100;
    /** A line from the harness longer than this is a broken harness, not an event. */
    static final int LINE_CHARS_MAX = 4096;
    /** Kafka Streams takes 3–5 s to RUNNING here; a fresh cluster's first topics add seconds. */
    static final Duration RUNNING_TIMEOUT = Duration.ofSeconds(120);
    /** How long a first record may take through the pipeline before the app gives up. */
    static final Duration PIPELINE_TIMEOUT = Duration.ofSeconds(60);
    /** How long Kafka Streams may take to close on SIGTERM; the harness kills it at 20 s. */
    static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(10);
    /** Threads answering point queries: the harness keeps up to 4 keep-alive connections warm. */
    static final int QUERY_THREADS = 4;

    public static void main(String[] args) throws Exception {
        // Log4j stops its loggers in a shutdown hook of its own, racing ours: off, so what
        // Kafka Streams logs while it closes stays in the run's log.
        System.setProperty("log4j2.shutdownHookEnabled", "false");
        if (args.length == 1 && args[0].equals("version")) {
            System.out.println("kafka-streams " + AppInfoParser.getVersion());
            return;
        }
        Map<String, String> flags = parseFlags(args);
        new W3Streams(flags).run();
    }

    static Map<String, String> parseFlags(String[] args) {
        Map<String, String> flags = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected a --flag, got " + args[i]);
            }
            flags.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : List.of("brokers", "topic", "state-dir", "window-ms", "grace-ms", "replication",
                "linger-ms", "commit-interval-ms", "cache-bytes", "query-port", "harness")) {
            if (!flags.containsKey(required)) {
                throw new IllegalArgumentException("--" + required + " is required");
            }
        }
        return flags;
    }

    final Map<String, String> flags;
    final String topic;
    final String changes;
    final String finals;
    final AtomicBoolean stopping = new AtomicBoolean(false);
    /** Wall-clock time of the last record sent to the input topic (event or tick); 0: none yet. */
    final AtomicLong lastSendMs = new AtomicLong(0);
    KafkaStreams streams;
    KafkaProducer<String, String> producer;
    HttpServer queries;

    W3Streams(Map<String, String> flags) {
        this.flags = flags;
        this.topic = flags.get("topic");
        this.changes = topic + "-changes";
        this.finals = topic + "-finals";
    }

    long flag(String name) {
        return Long.parseLong(flags.get(name));
    }

    void run() throws Exception {
        createTopics();
        startStreams();
        ReadOnlyWindowStore<String, Long> store =
            streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.windowStore()));
        startQueries(store);
        producer = new KafkaProducer<>(producerConfig());
        KafkaConsumer<String, String> consumer = outputConsumer();
        Runtime.getRuntime().addShutdownHook(new Thread(this::stop, "w3-stop"));
        awaitPipeline(consumer);

        String[] harness = flags.get("harness").split(":");
        InetSocketAddress address = new InetSocketAddress(harness[0], Integer.parseInt(harness[1]));
        Socket produce = connect(address, "produce");
        Socket observe = connect(address, "observe");
        Thread observer = new Thread(() -> report(consumer, observe), "w3-observe");
        observer.start();
        Thread ticker = new Thread(this::tick, "w3-tick");
        ticker.setDaemon(true);
        ticker.start();
        System.err.println("w3-streams: ready (topic " + topic + ", queries on port " + flag("query-port") + ")");
        produceFromHarness(produce);
        // The harness closed the produce connection: the run is over; the observer and the
        // ticker run until the harness stops this process (SIGTERM).
        observer.join();
    }

    void createTopics() throws Exception {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        short replication = (short) flag("replication");
        try (Admin admin = Admin.create(config)) {
            List<NewTopic> topics = new ArrayList<>();
            // One partition each, as onehop's W3 stream: one task, one stream time.
            for (String name : List.of(topic, changes, finals)) {
                topics.add(new NewTopic(name, 1, replication));
            }
            admin.createTopics(topics).all().get(60, TimeUnit.SECONDS);
        }
    }

    Properties streamsConfig() {
        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, topic + "-app");
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        config.put(StreamsConfig.STATE_DIR_CONFIG, flags.get("state-dir"));
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, (int) flag("replication"));
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, flag("commit-interval-ms"));
        config.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, flag("cache-bytes"));
        config.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        config.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // The app's own producer (changelog, repartition and output topics) sends as the
        // input's producer does; Kafka Streams' own default linger is 100 ms.
        config.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "1");
        config.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
        config.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), (int) flag("linger-ms"));
        return config;
    }

    void startStreams() throws Exception {
        StreamsBuilder builder = new StreamsBuilder();
        long windowMs = flag("window-ms");
        long graceMs = flag("grace-ms");
        KTable<Windowed<String>, Long> counts = builder
            .stream(topic, Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(windowMs), Duration.ofMillis(graceMs)))
            .count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()));
        // Every update of a window's count: the plain changelog.
        counts.toStream()
            .filter((window, count) -> count != null)
            .map((window, count) -> KeyValue.pair(window.key(), window.window().start() + " " + count))
            .to(changes, Produced.with(Serdes.String(), Serdes.String()));
        // One final count per window, once stream time passes its end plus grace.
        counts.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
            .toStream()
            .filter((window, count) -> count != null)
            .map((window, count) -> KeyValue.pair(window.key(), window.window().start() + " " + count))
            .to(finals, Produced.with(Serdes.String(), Serdes.String()));

        streams = new KafkaStreams(builder.build(), streamsConfig());
        CountDownLatch running = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            }
            System.err.println("w3-streams: state " + before + " -> " + now);
        });
        streams.start();
        if (!running.await(RUNNING_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS)) {
            throw new IllegalStateException("Kafka Streams did not reach RUNNING within " + RUNNING_TIMEOUT);
        }
    }

    Properties producerConfig() {
        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        config.put(ProducerConfig.ACKS_CONFIG, "1");
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
        config.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        config.put(ProducerConfig.LINGER_MS_CONFIG, (int) flag("linger-ms"));
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        return config;
    }

    /** A consumer of both output topics from their start, with the consumer's defaults. */
    KafkaConsumer<String, String> outputConsumer() {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(config);
        List<TopicPartition> partitions = List.of(new TopicPartition(changes, 0), new TopicPartition(finals, 0));
        consumer.assign(partitions);
        consumer.seekToBeginning(partitions);
        // The first poll connects and finds the partitions' leaders before the schedule starts.
        consumer.poll(Duration.ofMillis(100));
        return consumer;
    }

    /**
     * Sends one tick through the whole pipeline and waits for its changelog row: RUNNING is not
     * yet processing (the first fetches of new topics, the stores' restoration checks take
     * seconds on a fresh cluster), and the schedule must not start before the app can keep up.
     */
    void awaitPipeline(KafkaConsumer<String, String> consumer) {
        long started = System.nanoTime();
        producer.send(new ProducerRecord<>(topic, null, System.currentTimeMillis(), TICK_KEY, "{}"));
        producer.flush();
        while (System.nanoTime() - started < PIPELINE_TIMEOUT.toNanos()) {
            for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100))) {
                if (TICK_KEY.equals(record.key()) && record.topic().equals(changes)) {
                    System.err.println("w3-streams: a first record came through the pipeline in "
                        + (System.nanoTime() - started) / 1_000_000 + " ms");
                    return;
                }
            }
        }
        throw new IllegalStateException("no record came through the pipeline within " + PIPELINE_TIMEOUT);
    }

    Socket connect(InetSocketAddress address, String role) throws IOException {
        Socket socket = new Socket();
        socket.setTcpNoDelay(true);
        socket.connect(address, 10_000);
        OutputStream out = socket.getOutputStream();
        out.write((role + "\n").getBytes(StandardCharsets.US_ASCII));
        out.flush();
        return socket;
    }

    /** Reads the harness's events and sends each to the input topic, answering per event. */
    void produceFromHarness(Socket socket) throws IOException {
        BufferedReader in =
            new BufferedReader(new InputStreamReader(socket.getInputStream(), StandardCharsets.US_ASCII), 64 * 1024);
        Writer answers = new OutputStreamWriter(socket.getOutputStream(), StandardCharsets.US_ASCII);
        String line;
        while ((line = in.readLine()) != null) {
            if (line.length() > LINE_CHARS_MAX) {
                throw new IOException("a line of " + line.length() + " characters from the harness");
            }
            String[] words = line.split(" ");
            if (words.length != 5 || !words[0].equals("P")) {
                throw new IOException("unexpected line from the harness: " + line);
            }
            String seq = words[1];
            String key = words[3];
            long eventMs = Long.parseLong(words[4]);
            String value = "{\"seq\":" + seq + ",\"event_ms\":" + eventMs + "}";
            lastSendMs.set(System.currentTimeMillis());
            producer.send(new ProducerRecord<>(topic, null, eventMs, key, value), (metadata, error) -> {
                String answer = error == null ? "A " + seq + "\n" : "F " + seq + " " + oneLine(error) + "\n";
                synchronized (answers) {
                    try {
                        answers.write(answer);
                        answers.flush();
                    } catch (IOException closed) {
                        // The harness has gone: nothing is left to answer.
                    }
                }
            });
        }
    }

    static String oneLine(Throwable error) {
        return String.valueOf(error).replace('\n', ' ');
    }

    /** Sends a tick whenever the input was idle for TICK_IDLE_MS after the first event. */
    void tick() {
        while (!stopping.get()) {
            try {
                Thread.sleep(TICK_IDLE_MS / 2);
            } catch (InterruptedException interrupted) {
                return;
            }
            long last = lastSendMs.get();
            long now = System.currentTimeMillis();
            if (last > 0 && now - last >= TICK_IDLE_MS) {
                lastSendMs.set(now);
                producer.send(new ProducerRecord<>(topic, null, now, TICK_KEY, "{}"));
            }
        }
    }

    /** Reports every output record to the harness, a poll's records in one write. */
    void report(KafkaConsumer<String, String> consumer, Socket socket) {
        try (consumer) {
            OutputStream out = socket.getOutputStream();
            StringBuilder lines = new StringBuilder();
            while (!stopping.get()) {
                lines.setLength(0);
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100))) {
                    if (TICK_KEY.equals(record.key()) || record.value() == null) {
                        continue;
                    }
                    String kind = record.topic().equals(finals) ? "f" : "c";
                    lines.append("W ").append(kind).append(' ').append(record.key()).append(' ')
                        .append(record.value()).append('\n');
                }
                if (lines.length() > 0) {
                    out.write(lines.toString().getBytes(StandardCharsets.US_ASCII));
                    out.flush();
                }
            }
        } catch (IOException | org.apache.kafka.common.errors.WakeupException | IllegalStateException ended) {
            if (!stopping.get()) {
                System.err.println("w3-streams: the report connection ended: " + oneLine(ended));
            }
        }
    }

    void startQueries(ReadOnlyWindowStore<String, Long> store) throws IOException {
        int port = (int) flag("query-port");
        queries = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
        ExecutorService threads = Executors.newFixedThreadPool(QUERY_THREADS);
        queries.setExecutor(threads);
        queries.createContext("/healthz", exchange -> answer(exchange, 200, "{\"status\":\"ok\"}"));
        queries.createContext("/views/", exchange -> {
            String path = exchange.getRequestURI().getPath();
            String key = path.substring(path.lastIndexOf('/') + 1);
            if (!exchange.getRequestMethod().equals("GET") || key.isEmpty()) {
                answer(exchange, 400, "{\"error\":\"bad_request\"}");
                return;
            }
            String rows;
            try {
                rows = windowsOf(store, key);
            } catch (RuntimeException unavailable) {
                answer(exchange, 503, "{\"error\":\"unavailable\",\"message\":\"" + oneLine(unavailable)
                    .replace('"', '\'') + "\"}");
                return;
            }
            if (rows.isEmpty()) {
                answer(exchange, 404, "{\"error\":\"not_found\"}");
            } else {
                answer(exchange, 200, "{\"key\":\"" + key + "\",\"rows\":[" + rows + "]}");
            }
        });
        queries.start();
    }

    /** The key's windows the store holds (it keeps them for window + grace), as JSON rows. */
    String windowsOf(ReadOnlyWindowStore<String, Long> store, String key) {
        long windowMs = flag("window-ms");
        Instant now = Instant.now();
        Instant from = now.minusMillis(2 * (windowMs + flag("grace-ms")));
        StringBuilder rows = new StringBuilder();
        try (WindowStoreIterator<Long> windows = store.fetch(key, from, now.plusMillis(windowMs))) {
            while (windows.hasNext()) {
                KeyValue<Long, Long> window = windows.next();
                if (rows.length() > 0) {
                    rows.append(',');
                }
                rows.append("{\"window_start\":").append(window.key).append(",\"window_end\":")
                    .append(window.key + windowMs).append(",\"n\":").append(window.value).append('}');
            }
        }
        return rows.toString();
    }

    static void answer(HttpExchange exchange, int status, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("content-type", "application/json");
        exchange.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(bytes);
        }
    }

    /** On SIGTERM: Kafka Streams closed cleanly (RocksDB's files and native library removed). */
    void stop() {
        stopping.set(true);
        if (queries != null) {
            queries.stop(0);
        }
        if (producer != null) {
            producer.close(Duration.ofSeconds(5));
        }
        if (streams != null) {
            long started = System.nanoTime();
            boolean closed = streams.close(CLOSE_TIMEOUT);
            long tookMs = (System.nanoTime() - started) / 1_000_000;
            System.err.println("w3-streams: " + (closed ? "closed" : "did not close within " + CLOSE_TIMEOUT)
                + " after " + tookMs + " ms");
        }
    }
}
