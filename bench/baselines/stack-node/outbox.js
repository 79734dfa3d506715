// onehop-peer-outbox: the application of study 1's W1 on the conventional stack, written as
// the study wrote it, in Node.js: an event is saved by inserting it into an outbox table in
// Postgres (pg), Debezium relays the table's inserts to Kafka (bench/baselines/cdc), and a
// kafkajs consumer looks up each of the event's keys in Redis (ioredis, SMEMBERS) and makes
// one HTTP POST per subscriber found.
//
// The harness (crates/bench/src/target/peers/outbox.rs) starts one per run, after it has made
// the outbox table, started the run's Debezium relay, and put every key's subscribers into
// Redis (SADD <prefix>keys/<key> <subscriber>…). The glue creates the run's topic, joins its
// consumer group, and inserts probe rows until one has come through Debezium and Kafka to its
// consumer (the relay's replication slot may not exist yet when the first is inserted). Then it
// opens one connection to the harness:
//
//   produce: first line "produce"; the harness writes "P <seq> <intended_ns> <key>…\n" per
//            event (W1: 5 keys), the glue answers "A <seq>\n" once the insert has committed
//            (Postgres fsynced its WAL), or "F <seq> <reason>\n".
//
// Its consumer POSTs {"seq":…,"key":…,"subscriber":…} to <notify>/subscribers/<subscriber>
// for every member of each key's set; the harness stamps each request when its bytes reach
// its socket. The glue reads no clock for the figures.
'use strict';

const { Kafka, logLevel } = require('kafkajs');
const Redis = require('ioredis');
const { Pool } = require('pg');
const common = require('./common');

const { fail, log, parseFlags, notifier, connectHarness, onLines, printVersion } = common;
common.name('onehop-peer-outbox');

// Connections to Postgres at most: pg's Pool default. At 50 events/s an insert commits in
// ~1–2 ms, so a few are ever busy at once; each event is its own transaction.
const POOL_CONNECTIONS_MAX = 10;
// How often a probe row is inserted while the pipeline is not yet through, and for how long.
const PROBE_EVERY_MS = 250;
const PROBE_TIMEOUT_MS = 120000;
// What the outbox router takes from a row (Debezium's defaults): aggregatetype and type say
// what happened, aggregateid becomes the Kafka key, payload the value.
const AGGREGATE_TYPE = 'w1_event';
// Diagnostic samples kept at most (see `lags` below).
const LAG_SAMPLES_MAX = 1000000;
const EVENT_TYPE = 'EventSaved';

function outboxFlags(argv) {
  const flags = parseFlags(argv, [
    'brokers', 'topic', 'group', 'postgres', 'database', 'user', 'table', 'redis', 'key-prefix', 'notify', 'harness',
  ]);
  const [pgHost, pgPort] = flags.postgres.split(':');
  const [redisHost, redisPort] = flags.redis.split(':');
  return {
    brokers: flags.brokers.split(','),
    topic: flags.topic,
    group: flags.group,
    partitions: Number(flags.partitions || 1),
    replication: Number(flags.replication || 1),
    minInsync: Number(flags['min-insync'] || 1),
    postgres: { host: pgHost, port: Number(pgPort), database: flags.database, user: flags.user },
    table: flags.table,
    redis: { host: redisHost, port: Number(redisPort) },
    keyPrefix: flags['key-prefix'],
    notify: new URL(flags.notify),
    harness: flags.harness,
  };
}

async function main() {
  const flags = outboxFlags(process.argv.slice(2));
  const kafka = new Kafka({ clientId: 'onehop-peer-outbox', brokers: flags.brokers, logLevel: logLevel.WARN });

  await common.createTopic(kafka, flags);

  const pool = new Pool({ ...flags.postgres, max: POOL_CONNECTIONS_MAX });
  const insert = (aggregateId, payload) =>
    pool.query(`INSERT INTO ${flags.table} (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4)`, [
      AGGREGATE_TYPE,
      aggregateId,
      EVENT_TYPE,
      JSON.stringify(payload),
    ]);

  const redis = new Redis({ ...flags.redis, lazyConnect: true });
  await redis.connect();
  const { notify, agent } = notifier(flags.notify);

  // The consumer: one event at a time per partition (kafkajs's eachMessage); each of its keys
  // looked up in Redis, and every subscriber found notified, side by side.
  let probeSeen = null;
  const probed = new Promise((resolve) => {
    probeSeen = resolve;
  });
  // Where the time goes, for the log only (never the harness's figures): how long after
  // Debezium read an event from the WAL (the Kafka record's timestamp, which the relay sets to
  // the change event's ts_ms) the consumer began on it, on the wall clock.
  const lags = [];
  const consumer = kafka.consumer({ groupId: flags.group });
  await consumer.connect();
  await consumer.subscribe({ topic: flags.topic, fromBeginning: true });
  const joined = new Promise((resolve) => consumer.on(consumer.events.GROUP_JOIN, resolve));
  await consumer.run({
    eachMessage: async ({ message }) => {
      if (lags.length < LAG_SAMPLES_MAX) lags.push(Date.now() - Number(message.timestamp));
      const event = JSON.parse(message.value.toString());
      if (event.probe !== undefined) {
        probeSeen(event.probe);
        return;
      }
      const members = await Promise.all(event.keys.map((key) => redis.smembers(flags.keyPrefix + 'keys/' + key)));
      const notifications = [];
      event.keys.forEach((key, index) => {
        for (const subscriber of members[index]) {
          notifications.push(
            notify(subscriber, JSON.stringify({ seq: event.seq, key, subscriber: Number(subscriber) })),
          );
        }
      });
      await Promise.all(notifications);
    },
  });
  await joined;

  // Probe rows until one comes through: the relay streams only what is committed after its
  // replication slot exists, and the harness must not start the schedule before then.
  let probes = 0;
  const started = Date.now();
  const prober = setInterval(() => {
    if (Date.now() - started > PROBE_TIMEOUT_MS) fail('no probe row came through Debezium and Kafka; see the relay\'s log');
    probes += 1;
    insert(`probe-${probes}`, { probe: probes }).catch((error) => log(`inserting a probe row: ${error.message}`));
  }, PROBE_EVERY_MS);
  const probe = await probed;
  clearInterval(prober);
  log(`probe ${probe} of ${probes} came through after ${Date.now() - started} ms`);

  const harness = await connectHarness(flags.harness, 'produce');
  const answer = (line) => harness.write(line);
  onLines(harness, (line) => {
    const [kind, seq, intendedNs, ...keys] = line.split(' ');
    if (kind !== 'P' || keys.length === 0) fail(`the harness sent ${JSON.stringify(line)}`);
    insert(seq, { seq: Number(seq), keys, intended_ns: intendedNs }).then(
      () => answer(`A ${seq}\n`),
      (error) => answer(`F ${seq} ${String(error.message).replace(/\n/g, ' ')}\n`),
    );
  });
  // The harness closes the connection once the run has drained, or stops the glue by its PID
  // (SIGTERM): either way the glue says where the time went and stops.
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    lags.sort((a, b) => a - b);
    const at = (q) => lags[Math.min(lags.length - 1, Math.floor(lags.length * q))];
    if (lags.length > 0) {
      log(`${lags.length} records: read from the WAL by Debezium (ts_ms) -> the consumer began on it p50 ${at(0.5)} ms, p99 ${at(0.99)} ms`);
    }
    await Promise.allSettled([consumer.disconnect(), pool.end()]);
    redis.disconnect();
    agent.destroy();
    process.exit(0);
  };
  harness.on('close', stop);
  process.on('SIGTERM', stop);
}

if (process.argv[2] === 'version') printVersion(['kafkajs', 'ioredis', 'pg', 'lz4js']);
else main().catch((error) => fail(error.stack || String(error)));
