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

const http = require('http');
const net = require('net');
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs');
const Redis = require('ioredis');
const lz4 = require('lz4js');
const xxh32 = require('lz4js/xxh32');

// kafkajs ships no lz4 codec; its docs show registering one. lz4js is a pure-JS LZ4 in the
// frame format Kafka's lz4 compression type uses, but its frames do not set the descriptor's
// block-independence flag, and Kafka's broker refuses such a frame ("Dependent block stream is
// unsupported"). A frame of one block has nothing to depend on, so the glue sets the flag (and
// the descriptor's checksum again) on frames of one block, and refuses anything larger.
const LZ4_BLOCK_BYTES_MAX = 4 * 1024 * 1024; // lz4js's block size (4 MiB)
const LZ4_FLAG_BLOCK_INDEPENDENT = 0x20;
function compressLz4(buffer) {
  if (buffer.length > LZ4_BLOCK_BYTES_MAX) throw new Error(`an lz4 batch of ${buffer.length} bytes spans blocks`);
  const frame = Buffer.from(lz4.compress(buffer));
  // Magic (4 bytes), FLG, BD, then HC: the second byte of xxh32 over FLG and BD.
  frame[4] |= LZ4_FLAG_BLOCK_INDEPENDENT;
  frame[6] = (xxh32.hash(0, frame, 4, 2) >> 8) & 0xff;
  return frame;
}
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress(encoder) {
    return compressLz4(encoder.buffer);
  },
  async decompress(buffer) {
    return Buffer.from(lz4.decompress(buffer));
  },
});

// A line from the harness longer than this is a broken harness, not an event.
const LINE_BYTES_MAX = 4096;
// Sockets to the harness's notify endpoint at most, kept alive between requests: one event
// fans out to ~30 subscribers, and each POST waits for its answer.
const NOTIFY_SOCKETS_MAX = 64;

function parseFlags(argv) {
  const flags = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) fail(`bad argument ${argv[i]}`);
    flags[argv[i].slice(2)] = argv[i + 1];
  }
  for (const name of ['brokers', 'topic', 'group', 'redis', 'key-prefix', 'notify', 'harness']) {
    if (!(name in flags)) fail(`--${name} is required`);
  }
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

function fail(message) {
  process.stderr.write(`onehop-peer-stack: ${message}\n`);
  process.exit(1);
}

function log(message) {
  process.stderr.write(`onehop-peer-stack: ${message}\n`);
}

async function main() {
  const flags = parseFlags(process.argv.slice(2));
  const kafka = new Kafka({ clientId: 'onehop-peer-stack', brokers: flags.brokers, logLevel: logLevel.WARN });

  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({
    topics: [
      {
        topic: flags.topic,
        numPartitions: flags.partitions,
        replicationFactor: flags.replication,
        configEntries: [{ name: 'min.insync.replicas', value: String(flags.minInsync) }],
      },
    ],
    waitForLeaders: true,
  });
  await admin.disconnect();

  const [redisHost, redisPort] = flags.redis.split(':');
  const redis = new Redis({ host: redisHost, port: Number(redisPort), lazyConnect: true });
  await redis.connect();

  const agent = new http.Agent({ keepAlive: true, maxSockets: NOTIFY_SOCKETS_MAX });
  const notify = (subscriber, body) =>
    new Promise((resolve) => {
      const request = http.request(
        {
          agent,
          host: flags.notify.hostname,
          port: flags.notify.port,
          method: 'POST',
          path: `/subscribers/${subscriber}`,
          headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        },
        (response) => {
          if (response.statusCode >= 300) log(`notify ${subscriber}: HTTP ${response.statusCode}`);
          response.resume();
          response.on('end', resolve);
        },
      );
      request.on('error', (error) => {
        log(`notify ${subscriber}: ${error.message}`);
        resolve();
      });
      request.end(body);
    });

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
  let pending = '';
  harness.on('data', (chunk) => {
    pending += chunk.toString();
    const lines = pending.split('\n');
    pending = lines.pop();
    if (pending.length > LINE_BYTES_MAX) fail('the harness sent an overlong line');
    for (const line of lines) {
      const [kind, seq, intendedNs, tag] = line.split(' ');
      if (kind !== 'P' || tag === undefined) fail(`the harness sent ${JSON.stringify(line)}`);
      waiting.push({ seq: Number(seq), intendedNs, tag });
    }
    if (waiting.length > 0 && timer === null) {
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

function connectHarness(address, role) {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port: Number(port), noDelay: true }, () => {
      socket.write(`${role}\n`);
      resolve(socket);
    });
    socket.on('error', reject);
  });
}

// `node stack.js version`: Node's version and the client libraries', for meta.json.
function printVersion() {
  const libraries = ['kafkajs', 'ioredis', 'lz4js'].map((name) => `${name} ${require(`${name}/package.json`).version}`);
  process.stdout.write(`node ${process.version}, ${libraries.join(', ')}\n`);
}

if (process.argv[2] === 'version') printVersion();
else main().catch((error) => fail(error.stack || String(error)));
