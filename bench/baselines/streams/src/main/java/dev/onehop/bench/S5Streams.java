// onehop-peer-streams: study 5's scenarios on Kafka Streams, one application per run.
//
//   a  stateless: mapValues(upper case) → filter(length > 5), 1 KB text values.
//   b  word count: flatMapValues(split on spaces) → groupBy(word) → count → toStream, every
//      changed count to the output (key the word, value the count as Kafka's Long serde).
//   c  routing, JSON values of 2–30 KB read once into a tree (a JSON serde): path A merges user
//      events and product updates → flatMap(tags, 1→N: {seq, kind, tag, priority} keyed by the
//      tag) → split by priority into three outputs; path B filters orders (status not
//      cancelled) and clicks (not bots) → merge → re-key by customer → one output. --input is
//      users,products,orders,clicks and --output high,medium,low,customers.
//   d  joins, JSON values of 2–50 KB, every input a KTable of the fields the join reads (as
//      onehop's joined view keeps them): reviews ⋈ customers (FK review→customer, the author's
//      name) grouped by product into a summary (count, average stars, newest seq, the reviews
//      in id order), then orders ⟕ shipments (PK, the shipment keyed by its order id) ⋈
//      customers (FK order→customer) ⋈ products (FK order→product) ⟕ review summaries (FK
//      order→product: the product's reviews), every change of an order's enriched record to
//      the output keyed by the order id. --input is customers,products,orders,shipments,reviews.
//
// The harness (crates/bench/src/streams.rs) starts one per scenario and mode, after the brokers
// are up. The app creates its input and output topics (partitions and replication from the
// flags), starts Kafka Streams, and once it is RUNNING writes the file named by --ready, which
// the harness waits for; the harness's generator and latency consumer (onehop-peer-glue
// streams) then feed and read it through the brokers. Every setting the study leaves out is a
// flag, pinned by the harness and recorded in its meta.json.
//
// usage: S5Streams version | S5Streams --brokers … --scenario a|b|c|d --guarantee exactly_once_v2|at_least_once
//        --input T[,T…] --output T[,T…] --partitions N --replication N --threads N --commit-interval-ms N
//        --cache-bytes N --linger-ms N --state-dir DIR --ready FILE
package dev.onehop.bench;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class S5Streams {
    /** Kafka Streams takes seconds to RUNNING here; topics on a fresh cluster add more. */
    static final Duration RUNNING_TIMEOUT = Duration.ofSeconds(180);
    static final List<String> FLAGS = List.of("brokers", "scenario", "guarantee", "input", "output", "partitions",
            "replication", "threads", "commit-interval-ms", "cache-bytes", "linger-ms", "state-dir", "ready");

    private S5Streams() {}

    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("version")) {
            System.out.println("Kafka Streams " + org.apache.kafka.common.utils.AppInfoParser.getVersion());
            return;
        }
        Map<String, String> flags = parseFlags(args);
        List<String> inputs = List.of(flags.get("input").split(","));
        List<String> outputs = List.of(flags.get("output").split(","));
        String input = inputs.get(0);
        String output = outputs.get(0);
        int partitions = Integer.parseInt(flags.get("partitions"));
        short replication = Short.parseShort(flags.get("replication"));
        List<String> topics = new ArrayList<>(inputs);
        topics.addAll(outputs);
        createTopics(flags.get("brokers"), topics, partitions, replication);

        StreamsBuilder builder = new StreamsBuilder();
        switch (flags.get("scenario")) {
            case "a" -> builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .mapValues(value -> value.toUpperCase(Locale.ROOT))
                    .filter((key, value) -> value.length() > 5)
                    .to(output, Produced.with(Serdes.String(), Serdes.String()));
            case "b" -> builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .flatMapValues(value -> Arrays.asList(value.split(" ")))
                    .filter((key, word) -> !word.isEmpty())
                    .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
                    .count(Materialized.as("counts"))
                    .toStream()
                    .to(output, Produced.with(Serdes.String(), Serdes.Long()));
            case "c" -> routing(builder, inputs, outputs);
            case "d" -> joins(builder, inputs, output);
            default -> throw new IllegalArgumentException("--scenario is a, b, c or d, not " + flags.get("scenario"));
        }

        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, input + "-app");
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        config.put(StreamsConfig.STATE_DIR_CONFIG, flags.get("state-dir"));
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, flags.get("guarantee"));
        config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(flags.get("threads")));
        config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, (int) replication);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(flags.get("commit-interval-ms")));
        config.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(flags.get("cache-bytes")));
        config.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), Integer.parseInt(flags.get("linger-ms")));
        config.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");
        // Scenario d's join results carry no serde of their own: the foreign-key joins after
        // the first read them with these.
        config.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        config.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, JsonSerde.class);
        // Static membership, as a deployment that restarts its instances sets it: an instance
        // started again after a crash takes its place in the group at once, instead of
        // waiting out the dead member's session (45 s). Kafka Streams adds each thread's index.
        config.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), input + "-instance");

        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        CountDownLatch running = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + before + " → " + now);
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            System.out.println("stream thread failed: " + error);
            error.printStackTrace(System.out);
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(10))));
        streams.start();
        if (!running.await(RUNNING_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS)) {
            throw new IllegalStateException("Kafka Streams did not reach RUNNING within " + RUNNING_TIMEOUT);
        }
        Files.writeString(Path.of(flags.get("ready")), "running\n", StandardCharsets.UTF_8);
        System.out.println("ready: " + flags.get("scenario") + " " + flags.get("guarantee"));
        Thread.currentThread().join();
    }

    /** Scenario c's two paths. */
    static void routing(StreamsBuilder builder, List<String> inputs, List<String> outputs) {
        if (inputs.size() != 4 || outputs.size() != 4) {
            throw new IllegalArgumentException("scenario c reads users,products,orders,clicks and writes high,medium,low,customers");
        }
        Serde<JsonNode> json = new JsonSerde();
        Consumed<String, JsonNode> consumed = Consumed.with(Serdes.String(), json);
        Produced<String, JsonNode> produced = Produced.with(Serdes.String(), json);

        KStream<String, JsonNode> tagged = builder.stream(inputs.get(0), consumed)
                .merge(builder.stream(inputs.get(1), consumed))
                .flatMap((key, event) -> {
                    List<KeyValue<String, JsonNode>> out = new ArrayList<>();
                    for (JsonNode tag : event.path("tags")) {
                        ObjectNode routed = JsonNodeFactory.instance.objectNode();
                        routed.set("seq", event.get("seq"));
                        routed.set("kind", event.get("kind"));
                        routed.set("tag", tag);
                        routed.set("priority", event.get("priority"));
                        out.add(KeyValue.pair(tag.asText(), routed));
                    }
                    return out;
                });
        tagged.split()
                .branch((tag, routed) -> routed.path("priority").asText().equals("high"),
                        Branched.withConsumer(high -> high.to(outputs.get(0), produced)))
                .branch((tag, routed) -> routed.path("priority").asText().equals("medium"),
                        Branched.withConsumer(medium -> medium.to(outputs.get(1), produced)))
                .branch((tag, routed) -> routed.path("priority").asText().equals("low"),
                        Branched.withConsumer(low -> low.to(outputs.get(2), produced)))
                .noDefaultBranch();

        builder.stream(inputs.get(2), consumed)
                .filter((key, order) -> !order.path("status").asText().equals("cancelled"))
                .merge(builder.stream(inputs.get(3), consumed).filter((key, click) -> !click.path("bot").asBoolean()))
                .selectKey((key, record) -> record.path("customer").asText())
                .to(outputs.get(3), produced);
    }

    /** Scenario d: one enriched record per order, kept as its five inputs change. */
    static void joins(StreamsBuilder builder, List<String> inputs, String output) {
        if (inputs.size() != 5) {
            throw new IllegalArgumentException("scenario d reads customers,products,orders,shipments,reviews");
        }
        Serde<JsonNode> json = new JsonSerde();
        KTable<String, JsonNode> customers = table(builder, inputs.get(0), "customers", json, null, "seq", "name", "tier");
        KTable<String, JsonNode> products = table(builder, inputs.get(1), "products", json, null, "seq", "title", "price");
        KTable<String, JsonNode> orders = table(builder, inputs.get(2), "orders", json, "order_id", "seq", "customer", "product", "amount");
        KTable<String, JsonNode> shipments = table(builder, inputs.get(3), "shipments", json, null, "seq", "carrier", "status");
        KTable<String, JsonNode> reviews = table(builder, inputs.get(4), "reviews", json, "id", "seq", "product", "customer", "stars");

        KTable<String, JsonNode> summaries = reviews
                .join(customers, (id, review) -> review.path("customer").asText(), (review, customer) -> {
                    ObjectNode authored = review.deepCopy();
                    authored.set("author", customer.get("name"));
                    return authored;
                })
                .groupBy((id, review) -> KeyValue.pair(review.path("product").asText(), review),
                        Grouped.with("reviews-by-product", Serdes.String(), json))
                .aggregate(() -> summary(new TreeMap<>()),
                        (product, review, summary) -> summary(withReview(summary, review, true)),
                        (product, review, summary) -> summary(withReview(summary, review, false)),
                        Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>as("review-summaries")
                                .withKeySerde(Serdes.String()).withValueSerde(json));

        orders.leftJoin(shipments, (order, shipment) -> {
                    ObjectNode row = JsonNodeFactory.instance.objectNode();
                    row.set("order_id", order.get("order_id"));
                    row.set("order_seq", order.get("seq"));
                    row.set("amount", order.get("amount"));
                    row.set("customer", order.get("customer"));
                    row.set("product", order.get("product"));
                    row.set("shipment_seq", shipment == null ? null : shipment.get("seq"));
                    row.set("carrier", shipment == null ? null : shipment.get("carrier"));
                    row.set("status", shipment == null ? null : shipment.get("status"));
                    return (JsonNode) row;
                })
                .join(customers, (id, order) -> order.path("customer").asText(), (order, customer) -> {
                    ObjectNode row = order.deepCopy();
                    row.set("customer_seq", customer.get("seq"));
                    row.set("name", customer.get("name"));
                    row.set("tier", customer.get("tier"));
                    return (JsonNode) row;
                })
                .join(products, (id, order) -> order.path("product").asText(), (order, product) -> {
                    ObjectNode row = order.deepCopy();
                    row.set("product_seq", product.get("seq"));
                    row.set("title", product.get("title"));
                    row.set("price", product.get("price"));
                    return (JsonNode) row;
                })
                .leftJoin(summaries, (id, order) -> order.path("product").asText(), (order, summary) -> {
                    ObjectNode row = order.deepCopy();
                    for (String field : List.of("reviews", "rating", "review_seq", "latest")) {
                        row.set(field, summary == null || summary.path("reviews").asLong() == 0 ? null : summary.get(field));
                    }
                    return (JsonNode) row;
                })
                .toStream()
                .to(output, Produced.with(Serdes.String(), json));
    }

    /** An input as a KTable of the fields named, with the record key as keyField unless it is null. */
    static KTable<String, JsonNode> table(StreamsBuilder builder, String topic, String store, Serde<JsonNode> json,
            String keyField, String... fields) {
        return builder.stream(topic, Consumed.with(Serdes.String(), json))
                .mapValues((key, value) -> {
                    ObjectNode kept = JsonNodeFactory.instance.objectNode();
                    if (keyField != null) {
                        kept.put(keyField, key);
                    }
                    for (String field : fields) {
                        kept.set(field, value.get(field));
                    }
                    return (JsonNode) kept;
                })
                .toTable(Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>as(store)
                        .withKeySerde(Serdes.String()).withValueSerde(json));
    }

    /** A product's reviews by id, with one added (or taken out) by an aggregate's adder (subtractor). */
    static TreeMap<String, JsonNode> withReview(JsonNode summary, JsonNode review, boolean add) {
        TreeMap<String, JsonNode> byId = new TreeMap<>();
        for (JsonNode entry : summary.path("latest")) {
            byId.put(entry.path("id").asText(), entry);
        }
        String id = review.path("id").asText();
        if (add) {
            ObjectNode entry = JsonNodeFactory.instance.objectNode();
            entry.set("author", review.get("author"));
            entry.put("id", id);
            entry.set("seq", review.get("seq"));
            entry.set("stars", review.get("stars"));
            byId.put(id, entry);
        } else {
            byId.remove(id);
        }
        return byId;
    }

    /** A product's review summary: as onehop's view has it (count, average, newest seq, the reviews). */
    static JsonNode summary(TreeMap<String, JsonNode> byId) {
        ObjectNode summary = JsonNodeFactory.instance.objectNode();
        long stars = 0;
        long newest = -1;
        ArrayNode latest = summary.putArray("latest");
        for (JsonNode entry : byId.values()) {
            stars += entry.path("stars").asLong();
            newest = Math.max(newest, entry.path("seq").asLong());
            latest.add(entry);
        }
        summary.put("reviews", byId.size());
        if (byId.isEmpty()) {
            summary.putNull("rating");
            summary.putNull("review_seq");
        } else {
            summary.put("rating", (double) stars / byId.size());
            summary.put("review_seq", newest);
        }
        return summary;
    }

    /**
     * JSON values as Jackson trees; a value that is not JSON fails the task, as a bad Avro record
     * would. A class, so that it can be the default value serde.
     */
    public static final class JsonSerde implements Serde<JsonNode> {
        private static final ObjectMapper MAPPER = new ObjectMapper();

        @Override
        public Serializer<JsonNode> serializer() {
            return (topic, node) -> {
                try {
                    return node == null ? null : MAPPER.writeValueAsBytes(node);
                } catch (JsonProcessingException error) {
                    throw new SerializationException(error);
                }
            };
        }

        @Override
        public Deserializer<JsonNode> deserializer() {
            return (topic, bytes) -> {
                try {
                    return bytes == null ? null : MAPPER.readTree(bytes);
                } catch (IOException error) {
                    throw new SerializationException(error);
                }
            };
        }
    }

    /** The topics of the run, at the given partitions and replication; made again is fine. */
    static void createTopics(String brokers, List<String> names, int partitions, short replication)
            throws InterruptedException, ExecutionException {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        try (Admin admin = Admin.create(config)) {
            List<NewTopic> topics = new ArrayList<>();
            for (String name : names) {
                topics.add(new NewTopic(name, partitions, replication));
            }
            for (var result : admin.createTopics(topics).values().values()) {
                try {
                    result.get();
                } catch (ExecutionException error) {
                    if (!(error.getCause() instanceof TopicExistsException)) {
                        throw error;
                    }
                }
            }
        }
    }

    static Map<String, String> parseFlags(String[] args) {
        Map<String, String> flags = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--") || !FLAGS.contains(args[i].substring(2))) {
                throw new IllegalArgumentException("unknown flag " + args[i] + "; the flags: " + FLAGS);
            }
            flags.put(args[i].substring(2), args[i + 1]);
        }
        for (String flag : FLAGS) {
            if (!flags.containsKey(flag)) {
                throw new IllegalArgumentException("--" + flag + " is needed");
            }
        }
        return flags;
    }
}
