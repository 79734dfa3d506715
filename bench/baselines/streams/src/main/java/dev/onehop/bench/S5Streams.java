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
//
// The harness (crates/bench/src/streams.rs) starts one per scenario and mode, after the brokers
// are up. The app creates its input and output topics (partitions and replication from the
// flags), starts Kafka Streams, and once it is RUNNING writes the file named by --ready, which
// the harness waits for; the harness's generator and latency consumer (onehop-peer-glue
// streams) then feed and read it through the brokers. Every setting the study leaves out is a
// flag, pinned by the harness and recorded in its meta.json.
//
// usage: S5Streams version | S5Streams --brokers … --scenario a|b|c --guarantee exactly_once_v2|at_least_once
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
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
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
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

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
            default -> throw new IllegalArgumentException("--scenario is a, b or c, not " + flags.get("scenario"));
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
        Serde<JsonNode> json = jsonSerde();
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

    /** JSON values as Jackson trees; a value that is not JSON fails the task, as a bad Avro record would. */
    static Serde<JsonNode> jsonSerde() {
        ObjectMapper mapper = new ObjectMapper();
        Serializer<JsonNode> serializer = (topic, node) -> {
            try {
                return node == null ? null : mapper.writeValueAsBytes(node);
            } catch (JsonProcessingException error) {
                throw new SerializationException(error);
            }
        };
        Deserializer<JsonNode> deserializer = (topic, bytes) -> {
            try {
                return bytes == null ? null : mapper.readTree(bytes);
            } catch (IOException error) {
                throw new SerializationException(error);
            }
        };
        return Serdes.serdeFrom(serializer, deserializer);
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
