// onehop-peer-stack: the application of study 1's W2 on the conventional stack, written as
// the study wrote it, in Node.js: a kafkajs producer, a kafkajs consumer that looks up each
// event's tag in Redis (ioredis, SMEMBERS) and makes one HTTP POST per subscriber.
//
// The harness (crates/bench/src/target/peers/kafka_stack.rs) starts one per run, after it has
// put every subscriber into its tags' Redis sets (SADD <prefix><tag> <subscriber>…). The glue
// creates the topic, joins its consumer group, then opens one connection to the harness:
//
//   produce: first line "produce"; the harness writes "P <seq> <intended_ns> <tag>\n" per
//            event, the glue answers "A <seq>\n" once Kafka acknowledged it (acks=all), or
//            "F <seq> <reason>\n".
//
// Its consumer POSTs {"seq":…,"tag":…,"subscriber":…} to <notify>/subscribers/<subscriber>
// for every member of the event's tag; the harness stamps each request when its bytes reach
// its socket. The glue reads no clock for the figures.
//
// kafkajs has no linger setting: its producer sends each send() call at once. The study's
// producer lingered 5 ms, so the glue gathers what arrives within --linger-ms of the first
// waiting event and sends it in one call, as the Java client's linger.ms does.
'use strict';

const { Kafka, CompressionTypes, logLevel } = require('kafkajs');
const Redis = require('ioredis');
const { fail, parseFlags, notifier, connectHarness, onLines, printVersion, createTopic } = require('./common');

function stackFlags(argv) {
  const flags = parseFlags(argv, ['brokers', 'topic', 'group', 'redis', 'key-prefix', 'notify', 'harness']);
  return {
    brokers: flags.brokers.split(','),
    topic: flags.topic,
    group: flags.group,
    partitions: Number(flags.partitions || 1),
    replication: Number(flags.replication || 1),
    minInsync: Number(flags['min-insync'] || 1),
    lingerMs: Number(flags['linger-ms'] || 0),
    redis: flags.redis,
    keyPrefix: flags['key-prefix'],
    notify: new URL(flags.notify),
    harness: flags.harness,
  };
}

async function main() {
  const flags = stackFlags(process.argv.slice(2));
  const kafka = new Kafka({ clientId: 'onehop-peer-stack', brokers: flags.brokers, logLevel: logLevel.WARN });

  await createTopic(kafka, flags);

  const [redisHost, redisPort] = flags.redis.split(':');
  const redis = new Redis({ host: redisHost, port: Number(redisPort), lazyConnect: true });
  await redis.connect();

  const { notify, agent } = notifier(flags.notify);

  // The consumer: one event at a time per partition (kafkajs's eachMessage), its subscribers
  // looked up in Redis and notified side by side.
  const consumer = kafka.consumer({ groupId: flags.group });
  await consumer.connect();
  await consumer.subscribe({ topic: flags.topic, fromBeginning: true });
  const joined = new Promise((resolve) => consumer.on(consumer.events.GROUP_JOIN, resolve));
  await consumer.run({
    eachMessage: async ({ message }) => {
      const event = JSON.parse(message.value.toString());
      const subscribers = await redis.smembers(flags.keyPrefix + event.tag);
      await Promise.all(
        subscribers.map((subscriber) =>
          notify(subscriber, JSON.stringify({ seq: event.seq, tag: event.tag, subscriber: Number(subscriber) })),
        ),
      );
    },
  });
  await joined;

  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();

  const harness = await connectHarness(flags.harness, 'produce');
  const answer = (line) => harness.write(line);
  let waiting = [];
  let timer = null;
  const flush = () => {
    timer = null;
    const batch = waiting;
    waiting = [];
    producer
      .send({
        topic: flags.topic,
        acks: -1,
        compression: CompressionTypes.LZ4,
        messages: batch.map((event) => ({
          key: event.tag,
          value: JSON.stringify({ seq: event.seq, tag: event.tag, intended_ns: event.intendedNs }),
        })),
      })
      .then(
        () => answer(batch.map((event) => `A ${event.seq}\n`).join('')),
        (error) => answer(batch.map((event) => `F ${event.seq} ${String(error.message).replace(/\n/g, ' ')}\n`).join('')),
      );
  };
  onLines(harness, (line) => {
    const [kind, seq, intendedNs, tag] = line.split(' ');
    if (kind !== 'P' || tag === undefined) fail(`the harness sent ${JSON.stringify(line)}`);
    waiting.push({ seq: Number(seq), intendedNs, tag });
    if (timer === null) {
      if (flags.lingerMs > 0) timer = setTimeout(flush, flags.lingerMs);
      else flush();
    }
  });
  // The harness closes the connection once the run has drained: the glue then stops.
  harness.on('close', async () => {
    await Promise.allSettled([producer.disconnect(), consumer.disconnect()]);
    redis.disconnect();
    agent.destroy();
    process.exit(0);
  });
}

if (process.argv[2] === 'version') printVersion(['kafkajs', 'ioredis', 'lz4js']);
else main().catch((error) => fail(error.stack || String(error)));
