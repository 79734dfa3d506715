//! `microservices` and `microservices-as-published` (study 2): the shop as the study built it,
//! a Fastify gateway calling four Fastify services over keep-alive HTTP
//! (`bench/baselines/shop-node`), each service with a database of its own. The study's MongoDB
//! cannot be installed here; each database is one of a PostgreSQL 15 of the target's own
//! (`postgres`), read through a node-postgres pool.
//!
//! Two layouts: `indexed` (the fair stack: rows found by product through an index, a listing
//! asking each service once) and `published` (as the study's code: no index on the product
//! columns, and a listing asking each of three services once per product).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::postgres::{PostgresPeer, USER};
use super::{PeerProcess, free_port, installed, version_of, wait_for_port};
use crate::client::http1::KeepAlive;
use crate::shop::Shop;

/// How long a service may take to listen, and the gateway to answer its health check.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How the services keep their rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Indexed,
    Published,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Indexed => "indexed",
            Layout::Published => "published",
        }
    }

    /// Each service's database and its tables.
    fn schemas(self) -> [(&'static str, &'static str); 4] {
        match self {
            Layout::Indexed => [
                (
                    "catalog",
                    "CREATE TABLE categories (id text PRIMARY KEY, name text); \
                     CREATE TABLE products (id text PRIMARY KEY, name text, description text, image text, category_id text); \
                     CREATE INDEX products_by_category ON products (category_id)",
                ),
                ("inventory", "CREATE TABLE inventory (product_id text PRIMARY KEY, stock integer, warehouse text)"),
                (
                    "pricing",
                    "CREATE TABLE prices (product_id text PRIMARY KEY, amount double precision, currency text)",
                ),
                (
                    "reviews",
                    "CREATE TABLE reviews (id text PRIMARY KEY, product_id text, rating integer, title text, author text); \
                     CREATE INDEX reviews_by_product ON reviews (product_id)",
                ),
            ],
            Layout::Published => [
                (
                    "catalog",
                    "CREATE TABLE categories (id text PRIMARY KEY, name text); \
                     CREATE TABLE products (id text PRIMARY KEY, name text, description text, image text, category_id text)",
                ),
                (
                    "inventory",
                    "CREATE TABLE inventory (id bigserial PRIMARY KEY, product_id text, stock integer, warehouse text)",
                ),
                (
                    "pricing",
                    "CREATE TABLE prices (id bigserial PRIMARY KEY, product_id text, amount double precision, currency text)",
                ),
                (
                    "reviews",
                    "CREATE TABLE reviews (id text PRIMARY KEY, product_id text, rating integer, title text, author text)",
                ),
            ],
        }
    }
}

/// The tables each service's database holds.
const SERVICE_TABLES: [(&str, &[&str]); 4] = [
    ("catalog", &["categories", "products"]),
    ("inventory", &["inventory"]),
    ("pricing", &["prices"]),
    ("reviews", &["reviews"]),
];

/// The stack, running: stopped (every process by its PID) when dropped.
pub struct ShopStack {
    /// The gateway last: it stops first (processes stop in reverse order of their start).
    processes: Vec<PeerProcess>,
    postgres: PostgresPeer,
    gateway: String,
    layout: Layout,
}

impl ShopStack {
    /// Starts Postgres in `dir`, writes the shop into one database per service, then starts the
    /// services and the gateway (serving `site`'s index.html); logs in `logs`.
    pub fn start(dir: &Path, logs: &Path, layout: Layout, shop: &Shop, site: &Path) -> anyhow::Result<ShopStack> {
        let script = installed("shop-node/shop.js", "microservices")?;
        installed("shop-node/node_modules", "microservices")?;
        let postgres = PostgresPeer::start_plain(dir, logs).context("starting Postgres")?;
        for ((service, schema), (_, tables)) in layout.schemas().iter().zip(SERVICE_TABLES) {
            let database = format!("shop_{service}");
            postgres.query(&format!("CREATE DATABASE {database}"))?;
            let mut script = format!("{schema};\n");
            for table in tables {
                for insert in shop.inserts_of(table) {
                    script.push_str(&insert);
                    script.push_str(";\n");
                }
            }
            script.push_str("ANALYZE;\n");
            postgres.script_in(&database, &script).with_context(|| format!("writing {service}'s tables"))?;
        }
        let mut processes = Vec::new();
        let mut bases = Vec::new();
        for (service, _) in SERVICE_TABLES {
            let port = free_port()?;
            let mut command = Command::new("node");
            command
                .arg(&script)
                .arg(service)
                .args(["--port", &port.to_string(), "--database"])
                .arg(format!("postgresql://{USER}@{}/shop_{service}", postgres.address()));
            let mut process = PeerProcess::start(service, command, logs.join(format!("shop-{service}.log")))?;
            wait_for_port(&format!("127.0.0.1:{port}"), &mut process, START_TIMEOUT)?;
            processes.push(process);
            bases.push(format!("{service}=http://127.0.0.1:{port}"));
        }
        let port = free_port()?;
        let mut command = Command::new("node");
        command
            .arg(&script)
            .arg("gateway")
            .args(["--port", &port.to_string(), "--layout", layout.name(), "--services", &bases.join(","), "--site"])
            .arg(site);
        let mut gateway = PeerProcess::start("gateway", command, logs.join("shop-gateway.log"))?;
        let address = format!("127.0.0.1:{port}");
        wait_for_port(&address, &mut gateway, START_TIMEOUT)?;
        processes.push(gateway);
        let stack = ShopStack { processes, postgres, gateway: address, layout };
        stack.healthy()?;
        Ok(stack)
    }

    /// Waits until the gateway answers its health check, which asks every service's database.
    fn healthy(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let answer = KeepAlive::connect(&self.gateway).and_then(|mut client| client.send("GET", "/healthz", b""));
            match answer {
                Ok((200, _)) => return Ok(()),
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Ok((status, body)) => {
                    bail!("the shop's gateway answered its health check {status}: {}", String::from_utf8_lossy(&body))
                }
                Err(error) => bail!("the shop's gateway did not answer its health check: {error}"),
            }
        }
    }

    /// The gateway's `host:port`.
    pub fn address(&self) -> &str {
        &self.gateway
    }

    /// The PIDs of the stack's processes: Postgres, the services and the gateway.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.postgres.pid()).chain(self.processes.iter().map(PeerProcess::pid)).collect()
    }

    /// What meta.json records of the stack.
    pub fn settings(&self) -> serde_json::Value {
        let script = installed("shop-node/shop.js", "microservices").ok();
        let version = script.map_or_else(
            || "unknown".into(),
            |script| version_of(Path::new("node"), &[script.to_str().unwrap_or_default(), "version"]),
        );
        json!({
            "stack": version,
            "layout": self.layout.name(),
            "shape": "a Fastify gateway calling catalog, inventory, pricing and reviews services over keep-alive HTTP \
                      (node:http Agent, 64 sockets per service), each service with its own database",
            "database": "PostgreSQL 15, one database per service, node-postgres pools of 10 (the study: MongoDB, \
                         not installable here)",
            "listing_calls": match self.layout {
                Layout::Indexed => "one call per service for the whole listing (an index on every product column)",
                Layout::Published => "three calls per product (inventory, pricing, reviews), no index on product columns",
            },
            "postgres": self.postgres.settings(),
        })
    }
}

impl Drop for ShopStack {
    fn drop(&mut self) {
        // The gateway first, then the services; Postgres when its own handle drops.
        while let Some(process) = self.processes.pop() {
            drop(process);
        }
    }
}
