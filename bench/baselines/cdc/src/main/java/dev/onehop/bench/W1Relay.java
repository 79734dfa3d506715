// onehop-peer-cdc: the change-data-capture relay of study 1's W1 on the conventional stack.
// Debezium's embedded engine reads the outbox table's inserts from Postgres's write-ahead log
// (logical replication, pgoutput), Debezium's outbox event router turns each row into an
// event (key: the row's aggregateid, value: its payload), and a Kafka producer writes it to
// the run's topic. This is the relay a team runs between an outbox table and Kafka, without
// Kafka Connect's worker around it: Debezium Server needs Java 21, which these machines lack.
//
// The harness (crates/bench/src/target/peers/outbox.rs) starts one per run, after it has made
// the outbox table and its publication; the relay makes its own replication slot (dropped when
// it stops) and streams from there on, with no snapshot. It reports nothing to the harness:
// the Node.js glue (bench/baselines/stack-node/outbox.js) waits until a probe row of its own
// has come through the relay and Kafka before the run starts.
//
// A batch Debezium hands over is sent whole, then the relay waits for every record's
// acknowledgement (acks=all) before it marks the batch processed, as Kafka Connect's source
// task and Debezium Server's Kafka sink do: an offset is committed only for what Kafka has.
//
// `java … dev.onehop.bench.W1Relay version` prints the versions, for meta.json. SIGTERM
// closes the engine (and drops the slot) and the producer.
package dev.onehop.bench;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.connect.source.SourceRecord;

public final class W1Relay {
    private static final String[] REQUIRED = {
        "postgres", "database", "user", "table", "publication", "slot", "offsets", "brokers", "topic",
        "poll-interval-ms", "linger-ms", "compression",
    };

    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("version")) {
            System.out.println("debezium " + io.debezium.connector.postgresql.Module.version() + " (embedded engine, postgres connector), kafka-clients "
                    + AppInfoParser.getVersion());
            return;
        }
        Map<String, String> flags = parseFlags(args);
        KafkaProducer<String, String> producer = new KafkaProducer<>(producerProperties(flags));
        Stats stats = new Stats();
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(engineProperties(flags))
                .notifying((records, committer) -> {
                    long handedMs = System.currentTimeMillis();
                    List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
                    for (RecordChangeEvent<SourceRecord> event : records) {
                        SourceRecord record = event.record();
                        // The router drops what is not an insert into the outbox (heartbeats,
                        // tombstones): only an event with a value is sent. Its timestamp (the
                        // router's: the change event's ts_ms, when the connector read the row
                        // from the WAL) becomes the Kafka record's, as Kafka Connect's source
                        // task does.
                        if (record.value() != null) {
                            String key = record.key() == null ? null : record.key().toString();
                            if (record.timestamp() != null) {
                                stats.handedOver(handedMs - record.timestamp());
                            }
                            sent.add(producer.send(new ProducerRecord<>(record.topic(), null, record.timestamp(), key, record.value().toString())));
                        }
                    }
                    for (Future<RecordMetadata> future : sent) {
                        try {
                            future.get();
                        } catch (ExecutionException error) {
                            // Not marked processed: the engine stops and the run fails loudly.
                            throw new IllegalStateException("Kafka refused an outbox event", error.getCause());
                        }
                    }
                    stats.batch(sent.size(), System.currentTimeMillis() - handedMs);
                    for (RecordChangeEvent<SourceRecord> event : records) {
                        committer.markProcessed(event);
                    }
                    committer.markBatchFinished();
                })
                .using((success, message, error) -> {
                    System.err.println("onehop-peer-cdc: the engine stopped (" + (success ? "cleanly" : "failed") + "): " + message);
                    if (error != null) {
                        error.printStackTrace();
                    }
                })
                .build();
        // SIGTERM: close the engine (its slot is dropped) and the producer. The engine runs on
        // the main thread; if it stops on its own (a failure, said in the log), the relay exits.
        java.util.concurrent.atomic.AtomicBoolean stopping = new java.util.concurrent.atomic.AtomicBoolean();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            System.err.println("onehop-peer-cdc: " + stats);
            try {
                engine.close();
            } catch (Exception error) {
                error.printStackTrace();
            }
            producer.close(java.time.Duration.ofSeconds(5));
        }, "onehop-peer-cdc-stop"));
        engine.run();
        if (!stopping.get()) {
            System.exit(1);
        }
    }

    // Debezium's Postgres connector, as a team would configure it for an outbox: pgoutput, the
    // harness's publication, a slot of the run's own, no snapshot, the outbox event router.
    private static Properties engineProperties(Map<String, String> flags) {
        String[] postgres = flags.get("postgres").split(":");
        Properties properties = new Properties();
        properties.setProperty("name", "onehop-w1-outbox");
        properties.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        properties.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        properties.setProperty("offset.storage.file.filename", flags.get("offsets"));
        properties.setProperty("database.hostname", postgres[0]);
        properties.setProperty("database.port", postgres[1]);
        properties.setProperty("database.user", flags.get("user"));
        properties.setProperty("database.password", "");
        properties.setProperty("database.dbname", flags.get("database"));
        properties.setProperty("topic.prefix", "onehop");
        properties.setProperty("plugin.name", "pgoutput");
        properties.setProperty("publication.name", flags.get("publication"));
        properties.setProperty("publication.autocreate.mode", "disabled");
        properties.setProperty("slot.name", flags.get("slot"));
        properties.setProperty("slot.drop.on.stop", "true");
        properties.setProperty("table.include.list", flags.get("table"));
        properties.setProperty("snapshot.mode", "no_data");
        properties.setProperty("poll.interval.ms", flags.get("poll-interval-ms"));
        properties.setProperty("transforms", "outbox");
        properties.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        // Every event to the run's topic (the router's default is outbox.event.<aggregatetype>).
        properties.setProperty("transforms.outbox.route.topic.replacement", flags.get("topic"));
        return properties;
    }

    private static Properties producerProperties(Map<String, String> flags) {
        Properties properties = new Properties();
        properties.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("brokers"));
        properties.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "onehop-peer-cdc");
        properties.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        properties.setProperty(ProducerConfig.LINGER_MS_CONFIG, flags.get("linger-ms"));
        properties.setProperty(ProducerConfig.COMPRESSION_TYPE_CONFIG, flags.get("compression"));
        properties.setProperty(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        properties.setProperty(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return properties;
    }

    // Where the relay's time goes, for its log only (never the harness's figures): how long
    // after the connector read a row from the WAL (its change event's ts_ms, the wall clock)
    // the engine handed it over, and how long Kafka took to acknowledge a batch.
    // Samples beyond the bound are counted, not kept.
    private static final class Stats {
        private static final int SAMPLES_MAX = 1_000_000;
        private final List<Long> handedOverMs = new ArrayList<>();
        private final List<Long> ackWaitMs = new ArrayList<>();
        private long batches;
        private long records;

        synchronized void handedOver(long ms) {
            if (handedOverMs.size() < SAMPLES_MAX) {
                handedOverMs.add(ms);
            }
        }

        synchronized void batch(int size, long ms) {
            batches += 1;
            records += size;
            if (ackWaitMs.size() < SAMPLES_MAX) {
                ackWaitMs.add(ms);
            }
        }

        private static String percentiles(List<Long> samples) {
            if (samples.isEmpty()) {
                return "none";
            }
            List<Long> sorted = new ArrayList<>(samples);
            java.util.Collections.sort(sorted);
            return "p50 " + sorted.get(sorted.size() / 2) + " ms, p99 " + sorted.get((int) (sorted.size() * 0.99)) + " ms";
        }

        @Override
        public synchronized String toString() {
            return records + " records in " + batches + " batches; read from the WAL (ts_ms) -> handed over by the engine "
                    + percentiles(handedOverMs) + "; a batch sent -> acknowledged by Kafka " + percentiles(ackWaitMs);
        }
    }

    private static Map<String, String> parseFlags(String[] args) {
        Map<String, String> flags = new HashMap<>();
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                fail("bad argument " + args[i]);
            }
            flags.put(args[i].substring(2), args[i + 1]);
        }
        for (String name : REQUIRED) {
            if (!flags.containsKey(name)) {
                fail("--" + name + " is required");
            }
        }
        return flags;
    }

    private static void fail(String message) {
        System.err.println("onehop-peer-cdc: " + message);
        System.exit(2);
    }
}
