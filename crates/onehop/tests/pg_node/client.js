// node-postgres against onehop's Postgres listener: a pool of clients logging in with SCRAM over
// TLS, a named prepared statement run ten times (node-postgres parses once and binds each
// time), parameters sent as text, a write with RETURNING, and a refusal with its SQLSTATE.
// Prints one line per check for crates/onehop/tests/postgres.rs.
const fs = require("fs");
const { Pool } = require("pg");

async function main() {
  const [port, user, password, ca] = process.argv.slice(2);
  const pool = new Pool({
    host: "127.0.0.1",
    port: Number(port),
    user,
    password,
    database: "onehop",
    ssl: { ca: fs.readFileSync(ca), servername: "127.0.0.1" },
    max: 2,
  });
  const totals = [];
  for (let i = 0; i < 10; i++) {
    const result = await pool.query({
      name: "cheaper-than",
      text: "SELECT COUNT(*) AS n FROM products WHERE price < $1",
      values: [10 + i * 20],
    });
    totals.push(Number(result.rows[0].n));
  }
  console.log("prepared " + JSON.stringify(totals));
  const inserted = await pool.query(
    "INSERT INTO products (id, title, price) VALUES ($1, $2, $3) RETURNING id, title",
    ["n1", "node lamp", 12.5],
  );
  console.log("returning " + JSON.stringify(inserted.rows));
  const read = await pool.query("SELECT title, price FROM products WHERE id = $1", ["n1"]);
  console.log("read " + JSON.stringify(read.rows));
  try {
    await pool.query("SELECT * FROM missing_table");
  } catch (error) {
    console.log("refused " + error.code);
  }
  await pool.end();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
