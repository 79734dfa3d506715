// kafkajs against onehop's Kafka listener, for crates/onehop/tests/kafka/kafkajs.rs.
//
// usage: node client.js BROKER TOPIC GROUP COUNT
//
// Creates TOPIC (3 partitions) with the admin client, produces COUNT keyed records with an
// idempotent producer (acks=all), in batches of 10 taking turns over none, gzip (built in),
// snappy (kafkajs-snappy), lz4 and zstd (codecs registered here on lz4js and zstd-wasm, as
// kafkajs's docs show for any codec), each with a header; then a consumer in GROUP reads from
// the beginning until it has COUNT records and commits. Prints one JSON line: what was sent,
// what was read, and the committed offsets the admin client fetches afterwards.
'use strict';

const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs');
const SnappyCodec = require('kafkajs-snappy');
const lz4 = require('lz4js');
const zstd = require('@bokuweb/zstd-wasm');

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec;
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress(encoder) {
    return Buffer.from(lz4.compress(encoder.buffer));
  },
  async decompress(buffer) {
    return Buffer.from(lz4.decompress(buffer));
  },
});
// zstd-wasm is initialised once, in main: initialising it again while kafkajs compresses a
// request's partitions side by side corrupts what it returns.
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  async compress(encoder) {
    return Buffer.from(zstd.compress(encoder.buffer, 3));
  },
  async decompress(buffer) {
    return Buffer.from(zstd.decompress(buffer));
  },
});
const CODECS = [
  CompressionTypes.None,
  CompressionTypes.GZIP,
  CompressionTypes.Snappy,
  CompressionTypes.LZ4,
  CompressionTypes.ZSTD,
];

async function main() {
  await zstd.init();
  const [broker, topic, group, countText] = process.argv.slice(2);
  const count = Number(countText);
  const kafka = new Kafka({ clientId: 'onehop-kafkajs-test', brokers: [broker], logLevel: logLevel.WARN });

  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true });

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const sent = [];
  for (let i = 0; i < count; i += 10) {
    const messages = [];
    for (let j = i; j < Math.min(i + 10, count); j++) {
      messages.push({ key: `key-${j}`, value: `value-${j}`, headers: { origin: 'kafkajs' } });
      sent.push(`key-${j}=value-${j}`);
    }
    const compression = CODECS[(i / 10) % CODECS.length];
    await producer.send({ topic, acks: -1, compression, messages });
  }
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const read = [];
  let headersSeen = 0;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`read ${read.length} of ${count} in time`)), 30000);
    consumer
      .run({
        eachMessage: async ({ message }) => {
          read.push(`${message.key}=${message.value}`);
          if (message.headers.origin && message.headers.origin.toString() === 'kafkajs') headersSeen++;
          if (read.length >= count) {
            clearTimeout(timer);
            resolve();
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect();

  const committed = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  await admin.disconnect();
  const offsets = committed[0].partitions.map((p) => Number(p.offset)).reduce((a, b) => a + b, 0);
  console.log(JSON.stringify({ sent: sent.length, read, headersSeen, committedTotal: offsets }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
