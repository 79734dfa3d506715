// What the Node.js glue of W1 (outbox.js) and W2 (stack.js) share: the lz4 codec kafkajs lacks,
// the HTTP notification of one subscriber, the connection to the harness, and flag parsing.
'use strict';

const http = require('http');
const net = require('net');
const { CompressionTypes, CompressionCodecs } = require('kafkajs');
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
// Sockets to the harness's notify endpoint at most, kept alive between requests: one W2 event
// fans out to ~30 subscribers, and each POST waits for its answer.
const NOTIFY_SOCKETS_MAX = 64;

let program = 'onehop-peer-stack';
function name(glue) {
  program = glue;
}

function fail(message) {
  process.stderr.write(`${program}: ${message}\n`);
  process.exit(1);
}

function log(message) {
  process.stderr.write(`${program}: ${message}\n`);
}

// `--name value` pairs; every name in `required` must be given.
function parseFlags(argv, required) {
  const flags = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) fail(`bad argument ${argv[i]}`);
    flags[argv[i].slice(2)] = argv[i + 1];
  }
  for (const flag of required) {
    if (!(flag in flags)) fail(`--${flag} is required`);
  }
  return flags;
}

// A function that POSTs `body` to <notify>/subscribers/<subscriber> and resolves once answered
// (a failure is logged, never thrown: the harness counts what did not arrive), and its agent.
function notifier(notifyUrl) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: NOTIFY_SOCKETS_MAX });
  const notify = (subscriber, body) =>
    new Promise((resolve) => {
      const request = http.request(
        {
          agent,
          host: notifyUrl.hostname,
          port: notifyUrl.port,
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
  return { notify, agent };
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

// Calls `each(line)` for every complete line the harness writes on `socket`.
function onLines(socket, each) {
  let pending = '';
  socket.on('data', (chunk) => {
    pending += chunk.toString();
    const lines = pending.split('\n');
    pending = lines.pop();
    if (pending.length > LINE_BYTES_MAX) fail('the harness sent an overlong line');
    for (const line of lines) each(line);
  });
}

// Node's version and the client libraries', for meta.json.
function printVersion(libraries) {
  const versions = libraries.map((library) => `${library} ${require(`${library}/package.json`).version}`);
  process.stdout.write(`node ${process.version}, ${versions.join(', ')}\n`);
}

/** Creates the run's topic (`flags.topic`, its partitions, replication and min ISR) and waits
 * until every partition has a leader. */
async function createTopic(kafka, flags) {
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
}

module.exports = {
  name,
  fail,
  log,
  parseFlags,
  notifier,
  connectHarness,
  onLines,
  printVersion,
  createTopic,
  NOTIFY_SOCKETS_MAX,
};
