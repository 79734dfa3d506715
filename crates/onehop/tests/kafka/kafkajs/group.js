// kafkajs roles for crates/onehop/tests/kafka/kafkajs.rs, the same as confluent/group.py's.
//
// usage:
//   node group.js consume BROKER TOPIC GROUP
//       A member of GROUP: prints each value it receives ("V <value>"), then commits the offset
//       after it (commitOffsets, autoCommit off), retrying while the server is away; SIGTERM
//       disconnects it (LeaveGroup) and ends it.
//   node group.js produce BROKER TOPIC FIRST COUNT
//       An idempotent producer (acks=all, lz4) writing values FIRST..FIRST+COUNT in sends of
//       ten; prints each acknowledgement ("A <partition> <offset> <value>", the offset being the
//       partition's base offset in the send plus the record's place among that partition's
//       records in it), or "F <error>" for each record of a send that failed; retries across a
//       server restart.
//
// kafkajs logs to stdout by default; here its log goes to stderr, so that stdout holds only
// the lines above.
'use strict';

const { Kafka, CompressionTypes, CompressionCodecs, Partitioners, logLevel } = require('kafkajs');
const lz4 = require('lz4js');

CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress(encoder) {
    return Buffer.from(lz4.compress(encoder.buffer));
  },
  async decompress(buffer) {
    return Buffer.from(lz4.decompress(buffer));
  },
});

// Records per send: each send is one produce request, one batch per partition.
const SEND_RECORDS = 10;

function client(broker) {
  return new Kafka({
    clientId: 'onehop-kafkajs-group',
    brokers: [broker],
    logLevel: logLevel.WARN,
    logCreator: () => ({ namespace, level, log }) => {
      process.stderr.write(`${new Date().toISOString()} ${level} ${namespace}: ${log.message}\n`);
    },
    // Enough to outlast a server restart of a few seconds (about 80 s in all).
    retry: { retries: 30, initialRetryTime: 300, maxRetryTime: 3000 },
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function consume(broker, topic, group) {
  let stopping = false;
  const consumer = client(broker).consumer({
    groupId: group,
    sessionTimeout: 10000,
    heartbeatInterval: 1000,
    // kafkajs heartbeats between fetches: a short wait lets it hear of a rebalance soon.
    maxWaitTimeInMs: 500,
  });
  process.on('SIGTERM', () => {
    stopping = true;
    consumer.disconnect().then(
      () => process.exit(0),
      (error) => {
        console.error(error);
        process.exit(1);
      },
    );
  });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, partition, message }) => {
      process.stdout.write(`V ${message.value}\n`);
      const offset = (BigInt(message.offset) + 1n).toString();
      while (!stopping) {
        try {
          await consumer.commitOffsets([{ topic, partition, offset }]);
          return;
        } catch (error) {
          process.stderr.write(`commit at ${partition}:${offset} failed: ${error.message}\n`);
          await sleep(200);
        }
      }
    },
  });
}

async function produce(broker, topic, first, count) {
  // kafkajs's default partitioner (murmur2 of the key, as Java's), noting where each record
  // went so that its offset can be told from its partition's base offset.
  const createPartitioner = () => {
    const partitioner = Partitioners.DefaultPartitioner();
    return (arguments_) => {
      const partition = partitioner(arguments_);
      arguments_.message.chosenPartition = partition;
      return partition;
    };
  };
  const producer = client(broker).producer({ idempotent: true, maxInFlightRequests: 1, createPartitioner });
  await producer.connect();
  let failed = 0;
  for (let start = first; start < first + count; start += SEND_RECORDS) {
    const messages = [];
    for (let i = start; i < Math.min(start + SEND_RECORDS, first + count); i++) {
      messages.push({ key: `k${i}`, value: `v${i}` });
    }
    let metadata;
    try {
      metadata = await producer.send({ topic, acks: -1, compression: CompressionTypes.LZ4, messages });
    } catch (error) {
      for (let i = 0; i < messages.length; i++) process.stdout.write(`F ${error.message}\n`);
      failed += messages.length;
      continue;
    }
    const baseOffsets = new Map(metadata.map((entry) => [entry.partition, BigInt(entry.baseOffset)]));
    const placed = new Map();
    for (const message of messages) {
      const partition = message.chosenPartition;
      if (!baseOffsets.has(partition)) throw new Error(`no acknowledgement for partition ${partition}`);
      const index = placed.get(partition) ?? 0n;
      placed.set(partition, index + 1n);
      process.stdout.write(`A ${partition} ${baseOffsets.get(partition) + index} ${message.value}\n`);
    }
  }
  await producer.disconnect();
  if (failed > 0) {
    console.error(`${failed} records not acknowledged`);
    process.exit(1);
  }
}

async function main() {
  const [role, ...rest] = process.argv.slice(2);
  if (role === 'consume') {
    await consume(rest[0], rest[1], rest[2]);
  } else if (role === 'produce') {
    await produce(rest[0], rest[1], Number(rest[2]), Number(rest[3]));
  } else {
    throw new Error(`unknown role ${role}`);
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
