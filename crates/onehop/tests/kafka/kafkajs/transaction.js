// kafkajs transactions against onehop's Kafka listener, for crates/onehop/tests/kafka/kafkajs.rs.
//
// usage: node transaction.js BROKER HTTP TOPIC GROUP
//
// A transactional producer writes five records and commits offsets of GROUP in one
// transaction; while it is open, onehop's HTTP API is asked how many records TOPIC holds; then
// it commits, and is asked again. A second transaction writes three records and aborts. A
// read_committed consumer then reads TOPIC from the beginning. Prints one JSON line with the
// counts seen over HTTP at each step, what the consumer read, and GROUP's committed offsets.
'use strict';

const { Kafka, logLevel } = require('kafkajs');

async function storedOverHttp(http, topic) {
  const response = await fetch(`http://${http}/streams/${topic}?from=earliest&limit=1000`);
  const page = await response.json();
  return page.records.map((record) => String(record.value_text ?? record.value));
}

async function main() {
  const [broker, http, topic, group] = process.argv.slice(2);
  const kafka = new Kafka({ clientId: 'onehop-kafkajs-txn', brokers: [broker], logLevel: logLevel.WARN });
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 2 }], waitForLeaders: true });

  const producer = kafka.producer({ transactionalId: 'kafkajs-txn', idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();

  const committing = await producer.transaction();
  for (let i = 0; i < 5; i++) {
    await committing.send({ topic, messages: [{ key: `k${i}`, value: `committed-${i}` }] });
  }
  await committing.sendOffsets({ consumerGroupId: group, topics: [{ topic, partitions: [{ partition: 0, offset: '42' }] }] });
  const whileOpen = (await storedOverHttp(http, topic)).length;
  await committing.commit();
  const afterCommit = (await storedOverHttp(http, topic)).length;

  const aborting = await producer.transaction();
  await aborting.send({ topic, messages: [0, 1, 2].map((i) => ({ key: `a${i}`, value: `aborted-${i}` })) });
  await aborting.abort();
  const afterAbort = await storedOverHttp(http, topic);
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: `${group}-reader`, readUncommitted: false });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const read = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, 5000);
    consumer
      .run({
        eachMessage: async ({ message }) => {
          read.push(message.value.toString());
          if (read.length > 5) {
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
  const offsets = committed[0].partitions.map((p) => [p.partition, Number(p.offset)]);
  console.log(JSON.stringify({ whileOpen, afterCommit, afterAbort, read, offsets }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
