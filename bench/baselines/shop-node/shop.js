// Study 2's microservices stack (../shared/BENCHMARKS.md, "Study 2"): a Fastify gateway calling
// four Fastify services — catalog, inventory, pricing, reviews — over keep-alive HTTP, each
// service with a database of its own (PostgreSQL through node-postgres pools, where the study
// had MongoDB, which these machines cannot install).
//
//   node shop.js version
//   node shop.js catalog|inventory|pricing|reviews --port P --database URL [--layout L]
//   node shop.js gateway --port P --services catalog=URL,inventory=URL,pricing=URL,reviews=URL
//                        --site DIR [--layout L]
//
// --layout indexed (the fair stack): each service finds rows by product through an index, and
// the gateway asks each service once for a whole listing. --layout published (as the study
// built it): no index on product_id, and the listing asks each of three services once per
// product (3 039 internal requests for 1 013 products).
//
// Every service answers GET /healthz once its pool has answered a query. The gateway's pages
// are the contract onehop's pages are checked against (crates/bench/src/shop.rs):
//   GET /                       the home page's HTML (read from --site at start)
//   GET /api/products?limit=N&category=C   {"products": [page, …]} in id order
//   GET /api/products/:id       one page, or 404
// and its writes (the study's load reads only; the harness's writes while reading use these):
//   PUT /api/products/:id/stock {"stock": N}    the inventory service's row
//   PUT /api/products/:id/price {"amount": X}   the pricing service's row
// each answered once the service's database has committed the change, 404 for no such row.
'use strict';

const fs = require('fs');
const path = require('path');
const http = require('http');
const Fastify = require('fastify');
const { Pool } = require('pg');

const PROGRAM = 'onehop-peer-shop';
const VERSION = '1';
// Connections each service's pool keeps to its database (node-postgres's default is 10).
const POOL_MAX = 10;
// Sockets the gateway keeps open to each service.
const SOCKETS_PER_SERVICE = 64;
// The listing's largest page, as onehop's list reads.
const LIMIT_MAX = 10000;

function fail(message) {
  process.stderr.write(`${PROGRAM}: ${message}\n`);
  process.exit(1);
}

function parseFlags(argv, required) {
  const flags = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) fail(`bad argument ${argv[i]}`);
    flags[argv[i].slice(2)] = argv[i + 1];
  }
  for (const name of required) if (!(name in flags)) fail(`--${name} is required`);
  return flags;
}

function layoutOf(flags) {
  const layout = flags.layout || 'indexed';
  if (layout !== 'indexed' && layout !== 'published') fail(`--layout ${layout}: indexed or published`);
  return layout;
}

// A limit from a query string: 1 to LIMIT_MAX, LIMIT_MAX when absent.
function limitOf(text) {
  if (text === undefined) return LIMIT_MAX;
  const limit = Number(text);
  if (!Number.isInteger(limit) || limit < 1 || limit > LIMIT_MAX) return null;
  return limit;
}

async function listen(app, port) {
  await app.listen({ port: Number(port), host: '127.0.0.1' });
  process.stderr.write(`${PROGRAM}: listening on 127.0.0.1:${port}\n`);
}

// What each service keeps and how it reads it. `rows(pool, ids)` answers the rows of several
// products; `one(pool, id)` those of one.
const SERVICES = {
  catalog: {
    async list(pool, category, limit) {
      const sql =
        'SELECT p.id, p.name, p.description, p.image, p.category_id, c.name AS category_name ' +
        'FROM products p LEFT JOIN categories c ON c.id = p.category_id ' +
        (category === undefined ? '' : 'WHERE p.category_id = $2 ') +
        'ORDER BY p.id COLLATE "C" LIMIT $1';
      const params = category === undefined ? [limit] : [limit, category];
      return (await pool.query(sql, params)).rows;
    },
    async one(pool, id) {
      const sql =
        'SELECT p.id, p.name, p.description, p.image, p.category_id, c.name AS category_name ' +
        'FROM products p LEFT JOIN categories c ON c.id = p.category_id WHERE p.id = $1';
      return (await pool.query(sql, [id])).rows;
    },
  },
  inventory: {
    async rows(pool, ids) {
      return (await pool.query('SELECT product_id, stock FROM inventory WHERE product_id = ANY($1)', [ids])).rows;
    },
    // A write's body: the field it sets and its check.
    write: { field: 'stock', valid: Number.isInteger, sql: 'UPDATE inventory SET stock = $2 WHERE product_id = $1' },
  },
  pricing: {
    async rows(pool, ids) {
      return (await pool.query('SELECT product_id, amount, currency FROM prices WHERE product_id = ANY($1)', [ids]))
        .rows;
    },
    write: { field: 'amount', valid: Number.isFinite, sql: 'UPDATE prices SET amount = $2 WHERE product_id = $1' },
  },
  reviews: {
    async rows(pool, ids) {
      const sql =
        'SELECT id, product_id, rating, title, author FROM reviews WHERE product_id = ANY($1) ORDER BY id COLLATE "C"';
      return (await pool.query(sql, [ids])).rows;
    },
  },
};

async function service(role, flags) {
  const pool = new Pool({ connectionString: flags.database, max: POOL_MAX });
  const kind = SERVICES[role];
  const app = Fastify({ logger: false });
  app.get('/healthz', async () => {
    await pool.query('SELECT 1');
    return { status: 'ok', role };
  });
  if (role === 'catalog') {
    app.get('/products', async (request, reply) => {
      const limit = limitOf(request.query.limit);
      if (limit === null) return reply.code(400).send({ error: `limit must be 1 to ${LIMIT_MAX}` });
      return kind.list(pool, request.query.category, limit);
    });
    app.get('/products/:id', async (request, reply) => {
      const rows = await kind.one(pool, request.params.id);
      if (rows.length === 0) return reply.code(404).send({ error: 'no such product' });
      return rows[0];
    });
  } else {
    // One product's rows, and (POST, a JSON array of ids) several products'.
    app.get('/by-product/:id', async (request) => kind.rows(pool, [request.params.id]));
    app.post('/by-product', async (request, reply) => {
      if (!Array.isArray(request.body) || !request.body.every((id) => typeof id === 'string')) {
        return reply.code(400).send({ error: 'the body is a JSON array of product ids' });
      }
      return kind.rows(pool, request.body);
    });
  }
  if (kind.write) {
    const { field, valid, sql } = kind.write;
    app.put('/by-product/:id', async (request, reply) => {
      const value = request.body && request.body[field];
      if (!valid(value)) return reply.code(400).send({ error: `the body is {"${field}": …}` });
      const result = await pool.query(sql, [request.params.id, value]);
      if (result.rowCount === 0) return reply.code(404).send({ error: 'no such product' });
      return { product_id: request.params.id, [field]: value };
    });
  }
  await listen(app, flags.port);
}

// The gateway's client to one service: keep-alive sockets, a JSON answer or an error.
function client(base) {
  const url = new URL(base);
  const agent = new http.Agent({ keepAlive: true, maxSockets: SOCKETS_PER_SERVICE });
  return function call(method, target, body) {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const request = http.request(
        {
          agent,
          host: url.hostname,
          port: url.port,
          method,
          path: target,
          headers: payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {},
        },
        (response) => {
          const chunks = [];
          response.on('data', (chunk) => chunks.push(chunk));
          response.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            if (response.statusCode === 404) return resolve(null);
            if (response.statusCode !== 200) {
              // Fastify answers a thrown error with its statusCode: a service's 400 stays a 400.
              const error = new Error(`${method} ${target}: ${response.statusCode} ${text}`);
              error.statusCode = response.statusCode;
              return reject(error);
            }
            try {
              resolve(JSON.parse(text));
            } catch (error) {
              reject(error);
            }
          });
          response.on('error', reject);
        },
      );
      request.on('error', reject);
      if (payload) request.write(payload);
      request.end();
    });
  };
}

// One product's page from the services' rows: the same fields, values and order of reviews as
// onehop's product_pages view and the harness's own computation of it.
function page(product, stock, price, reviews) {
  const rating = reviews.length === 0 ? null : reviews.reduce((sum, review) => sum + review.rating, 0) / reviews.length;
  return {
    id: product.id,
    name: product.name,
    description: product.description,
    image: product.image,
    category_id: product.category_id,
    category: { id: product.category_id, name: product.category_name },
    stock: stock ? stock.stock : null,
    price: price ? price.amount : null,
    currency: price ? price.currency : null,
    review_count: reviews.length,
    rating,
    reviews: reviews.map((review) => ({ id: review.id, rating: review.rating, title: review.title, author: review.author })),
  };
}

function byProduct(rows) {
  const map = new Map();
  for (const row of rows) {
    if (!map.has(row.product_id)) map.set(row.product_id, []);
    map.get(row.product_id).push(row);
  }
  return map;
}

async function gateway(flags) {
  const layout = layoutOf(flags);
  const bases = {};
  for (const pair of flags.services.split(',')) {
    const [role, base] = pair.split('=');
    bases[role] = base;
  }
  for (const role of Object.keys(SERVICES)) if (!bases[role]) fail(`--services names no ${role}`);
  const call = {};
  for (const role of Object.keys(SERVICES)) call[role] = client(bases[role]);
  const home = fs.readFileSync(path.join(flags.site, 'index.html'));
  const app = Fastify({ logger: false });
  app.get('/healthz', async () => {
    await Promise.all(Object.keys(SERVICES).map((role) => call[role]('GET', '/healthz')));
    return { status: 'ok', role: 'gateway', layout };
  });
  app.get('/', async (request, reply) => reply.type('text/html; charset=utf-8').send(home));
  app.get('/api/products', async (request, reply) => {
    const limit = limitOf(request.query.limit);
    if (limit === null) return reply.code(400).send({ error: `limit must be 1 to ${LIMIT_MAX}` });
    const query = new URLSearchParams({ limit: String(limit) });
    if (request.query.category !== undefined) query.set('category', request.query.category);
    const products = await call.catalog('GET', `/products?${query}`);
    let stocks;
    let prices;
    let reviews;
    if (layout === 'indexed') {
      const ids = products.map((product) => product.id);
      [stocks, prices, reviews] = await Promise.all(
        ['inventory', 'pricing', 'reviews'].map((role) => call[role]('POST', '/by-product', ids).then(byProduct)),
      );
    } else {
      // As published: three calls per product, all at once.
      const each = (role) =>
        Promise.all(products.map((product) => call[role]('GET', `/by-product/${encodeURIComponent(product.id)}`)))
          .then((answers) => byProduct(answers.flat()));
      [stocks, prices, reviews] = await Promise.all([each('inventory'), each('pricing'), each('reviews')]);
    }
    const pages = products.map((product) =>
      page(
        product,
        (stocks.get(product.id) || [])[0],
        (prices.get(product.id) || [])[0],
        reviews.get(product.id) || [],
      ),
    );
    return { products: pages };
  });
  app.get('/api/products/:id', async (request, reply) => {
    const id = encodeURIComponent(request.params.id);
    const [product, stocks, prices, reviews] = await Promise.all([
      call.catalog('GET', `/products/${id}`),
      call.inventory('GET', `/by-product/${id}`),
      call.pricing('GET', `/by-product/${id}`),
      call.reviews('GET', `/by-product/${id}`),
    ]);
    if (product === null) return reply.code(404).send({ error: 'no such product' });
    return page(product, stocks[0], prices[0], reviews);
  });
  // The writes, each through the service that owns the row.
  for (const [what, role] of [['stock', 'inventory'], ['price', 'pricing']]) {
    app.put(`/api/products/:id/${what}`, async (request, reply) => {
      const answer = await call[role]('PUT', `/by-product/${encodeURIComponent(request.params.id)}`, request.body);
      if (answer === null) return reply.code(404).send({ error: 'no such product' });
      return answer;
    });
  }
  await listen(app, flags.port);
}

async function main() {
  const [role, ...rest] = process.argv.slice(2);
  if (role === 'version') {
    const fastify = require('fastify/package.json').version;
    const pg = require('pg/package.json').version;
    process.stdout.write(`${PROGRAM} ${VERSION} (fastify ${fastify}, pg ${pg}, node ${process.version})\n`);
    return;
  }
  if (role === 'gateway') return gateway(parseFlags(rest, ['port', 'services', 'site']));
  if (role in SERVICES) return service(role, parseFlags(rest, ['port', 'database']));
  fail(`unknown role ${role}: version, gateway, ${Object.keys(SERVICES).join(', ')}`);
}

main().catch((error) => fail(error.stack || String(error)));
