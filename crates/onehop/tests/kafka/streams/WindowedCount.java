// An exactly-once Kafka Streams app, for crates/onehop/tests/kafka/streams.rs: a count per key
// in tumbling windows of 10 s, with processing.guarantee=exactly_once_v2.
//
// usage: java -cp 'KAFKA_LIBS/*:CLASSES' WindowedCount BOOTSTRAP STATE_DIR BASE_MS
//
// Reads `clicks` (key: a user; value: a number i, whose event time is BASE_MS + i × 100 ms) and
// writes every change of a window's count to `counts` (key: `user@windowStart`, value: the
// count). The record cache is off, so each input record gives one output record: a window's
// counts read 1, 2, 3, … in `counts`, and exactly once means no number twice and none missing,
// whatever happens to the app.
import java.time.Duration;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.TimestampExtractor;

public class WindowedCount {
    static long baseMs;

    /** The event time a record's value names. */
    public static class ValueTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return baseMs + Long.parseLong(record.value().toString().trim()) * 100;
        }
    }

    public static void main(String[] args) throws Exception {
        baseMs = Long.parseLong(args[2]);
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "windowed-count");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // A member killed with kill -9 leaves the group within seconds, not Kafka's default 45.
        props.put("session.timeout.ms", 6000);
        props.put("heartbeat.interval.ms", 1000);
        // Small polls, and batches sent within 5 ms (Kafka Streams' default linger is 100 ms,
        // as long as a commit interval): an open transaction holds batches already sent most
        // of the time, so a kill -9 leaves some on the server, which must never show.
        props.put("max.poll.records", 50);
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream("clicks", Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new ValueTime()))
            .groupByKey()
            // No record is ever too late: every window stays open to updates.
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofDays(1)))
            .count(Materialized.as("window-counts"))
            .toStream()
            .map((window, count) -> KeyValue.pair(window.key() + "@" + window.window().start(), Long.toString(count)))
            .to("counts", Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((now, before) -> System.out.println("state " + now));
        streams.setUncaughtExceptionHandler(error -> {
            error.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
        streams.start();
        Thread.currentThread().join();
    }
}
