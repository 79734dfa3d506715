//! Study 2's shop (../shared/BENCHMARKS.md, "Study 2"), onehop's side: the data, its
//! definitions, its pages, and the loader (`onehop bench shop --load`).
//!
//! - The data, from a seed: 1 013 products in the study's 8 categories (111, 108, 110, 82, 85,
//!   121, 131, 265; ids `p_<category>_<i>`), an inventory row (stock 0–99) and a price
//!   (10.00–109.99) per product, and about one review for every two products (none, one, two
//!   or three per product).
//! - The definitions: five tables (what the microservices stack keeps in four services'
//!   databases), an aggregate view of each product's reviews (count, average, the reviews in
//!   id order) and a joined view with one row per product: the product page.
//! - The pages, read as a user of onehop would: the detail `GET /views/product_pages/{id}`, the
//!   listing `GET /views/product_pages?limit=10000` (one category: `&category_id=books`), the
//!   home page's HTML from `--static-dir` and its first 8 products (`?limit=8`).
//! - The contract both stacks answer: [`Shop::pages`] computes each product's page from the
//!   data alone, so a stack is checked against it, not against the other stack.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::client::http1::KeepAlive;
use crate::plan::Rng;

/// The study's categories: id, name, products.
pub const CATEGORIES: [(&str, &str, u32); 8] = [
    ("electronics", "Electronics", 111),
    ("books", "Books", 108),
    ("home", "Home & Kitchen", 110),
    ("garden", "Garden", 82),
    ("toys", "Toys", 85),
    ("sports", "Sports", 121),
    ("fashion", "Fashion", 131),
    ("beauty", "Beauty", 265),
];

/// The seed of the study's data set.
pub const DEFAULT_SEED: u64 = 0x0000_0057_d1e5_2026;

/// Rows per INSERT while loading.
const LOAD_BATCH: usize = 200;

/// The tables: the catalogue, the inventory and the prices by product, the reviews.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS categories (id TEXT PRIMARY KEY, name TEXT); \
     CREATE TABLE IF NOT EXISTS products (id TEXT PRIMARY KEY, name TEXT, description TEXT, image TEXT, \
       category_id TEXT REFERENCES categories (id)); \
     CREATE TABLE IF NOT EXISTS inventory (product_id TEXT PRIMARY KEY REFERENCES products (id), stock BIGINT, \
       warehouse TEXT); \
     CREATE TABLE IF NOT EXISTS prices (product_id TEXT PRIMARY KEY REFERENCES products (id), \
       amount DOUBLE PRECISION, currency TEXT); \
     CREATE TABLE IF NOT EXISTS reviews (id TEXT PRIMARY KEY, product_id TEXT REFERENCES products (id), \
       rating BIGINT, title TEXT, author TEXT); \
     CREATE INDEX IF NOT EXISTS reviews_by_product ON reviews (product_id)";

/// The pages: each product's reviews summed up, then one row per product with everything a
/// page shows.
pub const PAGES: &str = "CREATE VIEW IF NOT EXISTS review_summaries AS \
       SELECT product_id, COUNT(*) AS count, AVG(rating) AS average, \
         JSON_AGG(JSON_BUILD_OBJECT('id', id, 'rating', rating, 'title', title, 'author', author) ORDER BY id) \
           AS reviews \
       FROM reviews GROUP BY product_id; \
     CREATE VIEW IF NOT EXISTS product_pages AS \
       SELECT p.id, p.name, p.description, p.image, p.category_id, \
         JSON_BUILD_OBJECT('id', c.id, 'name', c.name) AS category, \
         i.stock, pr.amount AS price, pr.currency, \
         COALESCE(r.count, 0) AS review_count, r.average AS rating, COALESCE(r.reviews, JSON_BUILD_ARRAY()) AS reviews \
       FROM products p \
       LEFT JOIN categories c ON c.id = p.category_id \
       LEFT JOIN inventory i ON i.product_id = p.id \
       LEFT JOIN prices pr ON pr.product_id = p.id \
       LEFT JOIN review_summaries r ON r.product_id = p.id";

/// The home page's HTML, served as a static file.
pub const HOME_HTML: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>onehop shop</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0; color: #222; }
header { background: #14213d; color: #fff; padding: 1rem 2rem; }
main { display: grid; grid-template-columns: repeat(auto-fill, minmax(14rem, 1fr)); gap: 1rem; padding: 2rem; }
article { border: 1px solid #ddd; border-radius: .5rem; padding: 1rem; }
.price { font-weight: bold; } .stock { color: #666; font-size: .9rem; }
</style>
</head>
<body>
<header><h1>onehop shop</h1><p>Eight of our 1 013 products, live from the shop's own data.</p></header>
<main id="featured"></main>
<script>
fetch('/views/product_pages?limit=8').then(r => r.json()).then(page => {
  const main = document.getElementById('featured');
  for (const entry of page.keys) {
    const p = entry.rows[0], card = document.createElement('article');
    card.innerHTML = '<h2></h2><p class="price"></p><p class="stock"></p>';
    card.querySelector('h2').textContent = p.name;
    card.querySelector('.price').textContent = p.price.toFixed(2) + ' ' + p.currency;
    card.querySelector('.stock').textContent = p.stock + ' in stock, ' + p.review_count + ' reviews';
    main.appendChild(card);
  }
});
</script>
</body>
</html>
"#;

#[derive(Clone, Debug, PartialEq)]
pub struct Product {
    pub id: String,
    pub name: String,
    pub description: String,
    pub category: usize,
    pub stock: u32,
    pub warehouse: &'static str,
    /// The price in cents.
    pub cents: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Review {
    pub id: String,
    pub product: usize,
    pub rating: u32,
    pub title: String,
    pub author: String,
}

/// The shop's data, as the seed makes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shop {
    pub products: Vec<Product>,
    pub reviews: Vec<Review>,
}

const ADJECTIVES: [&str; 8] = ["compact", "classic", "bright", "sturdy", "light", "quiet", "smart", "soft"];
const AUTHORS: [&str; 6] = ["Ada", "Bo", "Chidi", "Dana", "Emil", "Farah"];
const VERDICTS: [&str; 5] = ["not for me", "it does the job", "good value", "very good", "love it"];

impl Shop {
    pub fn generate(seed: u64) -> Shop {
        let mut rng = Rng::new(seed, 2);
        let (mut products, mut reviews) = (Vec::new(), Vec::new());
        for (category, (slug, name, count)) in CATEGORIES.iter().enumerate() {
            for i in 1..=*count {
                let adjective = ADJECTIVES[rng.below(ADJECTIVES.len() as u32) as usize];
                let product = products.len();
                products.push(Product {
                    id: format!("p_{slug}_{i}"),
                    name: format!("{name} item {i}"),
                    description: format!("A {adjective} pick from our {name} range, number {i}."),
                    category,
                    stock: rng.below(100),
                    warehouse: if rng.below(2) == 0 { "north" } else { "south" },
                    cents: 1000 + rng.below(10_000),
                });
                // None, one, two or three reviews: 0.58 per product.
                let count = match rng.below(100) {
                    0..55 => 0,
                    55..90 => 1,
                    90..97 => 2,
                    _ => 3,
                };
                for _ in 0..count {
                    let rating = 1 + rng.below(5);
                    reviews.push(Review {
                        id: format!("r_{}", reviews.len() + 1),
                        product,
                        rating,
                        title: VERDICTS[rating as usize - 1].to_string(),
                        author: AUTHORS[rng.below(AUTHORS.len() as u32) as usize].to_string(),
                    });
                }
            }
        }
        Shop { products, reviews }
    }

    /// Every product's page, in id order (as a listing gives them): what both stacks answer.
    pub fn pages(&self) -> Vec<Value> {
        let mut by_product: Vec<Vec<&Review>> = vec![Vec::new(); self.products.len()];
        for review in &self.reviews {
            by_product[review.product].push(review);
        }
        let mut pages: Vec<Value> = self
            .products
            .iter()
            .zip(by_product)
            .map(|(product, mut reviews)| {
                let (slug, name, _) = CATEGORIES[product.category];
                reviews.sort_by(|a, b| a.id.cmp(&b.id));
                let rating = (!reviews.is_empty())
                    .then(|| reviews.iter().map(|review| f64::from(review.rating)).sum::<f64>() / reviews.len() as f64);
                json!({
                    "id": product.id,
                    "name": product.name,
                    "description": product.description,
                    "image": image(&product.id),
                    "category_id": slug,
                    "category": {"id": slug, "name": name},
                    "stock": product.stock,
                    "price": f64::from(product.cents) / 100.0,
                    "currency": "EUR",
                    "review_count": reviews.len(),
                    "rating": rating,
                    "reviews": reviews.iter().map(|review| json!({
                        "id": review.id, "rating": review.rating, "title": review.title, "author": review.author
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        pages.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        pages
    }

    /// The INSERT statements that write the data, table by table, in batches (the same
    /// statements for onehop and for Postgres).
    pub fn inserts(&self) -> Vec<String> {
        TABLES.iter().flat_map(|table| self.inserts_of(table)).collect()
    }

    /// The INSERT statements of one of [`TABLES`].
    pub fn inserts_of(&self, table: &str) -> Vec<String> {
        let mut statements = Vec::new();
        let mut batched = |name: &str, columns: &str, rows: Vec<String>| {
            if name != table {
                return;
            }
            for chunk in rows.chunks(LOAD_BATCH) {
                statements.push(format!("INSERT INTO {name} ({columns}) VALUES {}", chunk.join(", ")));
            }
        };
        batched(
            "categories",
            "id, name",
            CATEGORIES.iter().map(|(slug, name, _)| format!("({}, {})", text(slug), text(name))).collect(),
        );
        batched(
            "products",
            "id, name, description, image, category_id",
            self.products
                .iter()
                .map(|p| {
                    let category = CATEGORIES[p.category].0;
                    format!(
                        "({}, {}, {}, {}, {})",
                        text(&p.id),
                        text(&p.name),
                        text(&p.description),
                        text(&image(&p.id)),
                        text(category)
                    )
                })
                .collect(),
        );
        batched(
            "inventory",
            "product_id, stock, warehouse",
            self.products.iter().map(|p| format!("({}, {}, {})", text(&p.id), p.stock, text(p.warehouse))).collect(),
        );
        batched(
            "prices",
            "product_id, amount, currency",
            self.products
                .iter()
                .map(|p| format!("({}, {}.{:02}, 'EUR')", text(&p.id), p.cents / 100, p.cents % 100))
                .collect(),
        );
        batched(
            "reviews",
            "id, product_id, rating, title, author",
            self.reviews
                .iter()
                .map(|r| {
                    let product = &self.products[r.product].id;
                    format!(
                        "({}, {}, {}, {}, {})",
                        text(&r.id),
                        text(product),
                        r.rating,
                        text(&r.title),
                        text(&r.author)
                    )
                })
                .collect(),
        );
        statements
    }
}

/// The shop's tables, in the order they are written.
pub const TABLES: [&str; 5] = ["categories", "products", "inventory", "prices", "reviews"];

/// `value` as one text that two stacks' answers can be compared by, byte for byte: object
/// keys sorted, numbers by value (`4` and `4.0` alike: JavaScript writes a whole double
/// without its `.0`).
pub fn canonical(value: &Value) -> String {
    fn normal(value: &Value) -> Value {
        match value {
            Value::Number(number) => {
                number.as_f64().and_then(serde_json::Number::from_f64).map_or_else(|| value.clone(), Value::Number)
            }
            Value::Array(items) => Value::Array(items.iter().map(normal).collect()),
            Value::Object(fields) => {
                let mut sorted: Vec<(&String, &Value)> = fields.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(sorted.into_iter().map(|(key, value)| (key.clone(), normal(value))).collect())
            }
            other => other.clone(),
        }
    }
    normal(value).to_string()
}

/// A product's picture, as the pages link it.
fn image(id: &str) -> String {
    format!("/img/{id}.png")
}

/// `value` as an SQL string literal.
fn text(value: &str) -> String {
    let mut literal = String::with_capacity(value.len() + 2);
    literal.push('\'');
    for c in value.chars() {
        if c == '\'' {
            literal.push('\'');
        }
        literal.push(c);
    }
    literal.push('\'');
    literal
}

/// What a load did.
#[derive(Debug)]
pub struct Loaded {
    pub rows: usize,
    pub statements: usize,
    /// Until the last write was acknowledged.
    pub written: Duration,
    /// Until the pages answered what the data says.
    pub served: Duration,
}

/// Writes the shop into the onehop at `address` (host:port, HTTP) through `POST /sql`: the
/// tables, the pages' views, then the rows; waits until the listing is what the data says
/// (60 s at most). `progress` hears how far along it is.
pub fn load_onehop(
    address: &str,
    authorization: Option<&str>,
    shop: &Shop,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Loaded> {
    let started = Instant::now();
    let mut client = Client::connect(address, authorization)?;
    client.sql(SCHEMA).context("defining the shop's tables")?;
    client.sql(PAGES).context("defining the shop's pages")?;
    let statements = shop.inserts();
    let mut last_said = Instant::now();
    for (at, statement) in statements.iter().enumerate() {
        client.sql(statement).with_context(|| format!("writing batch {} of {}", at + 1, statements.len()))?;
        if last_said.elapsed() >= Duration::from_secs(1) || at + 1 == statements.len() {
            progress(&format!("written {} of {} batches", at + 1, statements.len()));
            last_said = Instant::now();
        }
    }
    let written = started.elapsed();
    let expected = shop.pages();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listing = client.listing("/views/product_pages?limit=10000")?;
        if listing == expected {
            break;
        }
        if Instant::now() >= deadline {
            let first_difference = listing.iter().zip(&expected).position(|(got, wanted)| got != wanted);
            bail!(
                "the listing is not the shop's data after 60 s: {} of {} pages, first difference at {first_difference:?}",
                listing.len(),
                expected.len()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rows = CATEGORIES.len() + shop.products.len() * 3 + shop.reviews.len();
    Ok(Loaded { rows, statements: statements.len() + 2, written, served: started.elapsed() })
}

/// A keep-alive connection to onehop's HTTP listener, with the load's credentials.
pub struct Client {
    connection: KeepAlive,
    authorization: Option<String>,
}

impl Client {
    pub fn connect(address: &str, authorization: Option<&str>) -> anyhow::Result<Client> {
        let connection = KeepAlive::connect(address).with_context(|| format!("connecting to {address}"))?;
        Ok(Client { connection, authorization: authorization.map(str::to_string) })
    }

    fn send(&mut self, method: &str, target: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        self.connection
            .send_as(method, target, self.authorization.as_deref(), body)
            .with_context(|| format!("{method} {target}"))
    }

    /// Runs `statements` through `POST /sql`; an answer other than 200 is an error.
    pub fn sql(&mut self, statements: &str) -> anyhow::Result<()> {
        let (status, body) = self.send("POST", "/sql", statements.as_bytes())?;
        if status != 200 {
            bail!("POST /sql answered {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }

    /// The page rows of a view listing (`GET /views/…`), in key order.
    pub fn listing(&mut self, target: &str) -> anyhow::Result<Vec<Value>> {
        let (status, body) = self.send("GET", target, b"")?;
        if status != 200 {
            bail!("GET {target} answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let answer: Value = serde_json::from_slice(&body).with_context(|| format!("GET {target}: not JSON"))?;
        let Some(keys) = answer["keys"].as_array() else { bail!("GET {target}: no keys in {answer}") };
        Ok(keys.iter().filter_map(|entry| entry["rows"].get(0).cloned()).collect())
    }

    /// The page of one product (`GET /views/product_pages/{id}`).
    pub fn detail(&mut self, id: &str) -> anyhow::Result<Option<Value>> {
        let target = format!("/views/product_pages/{id}");
        let (status, body) = self.send("GET", &target, b"")?;
        match status {
            200 => {
                let answer: Value = serde_json::from_slice(&body).with_context(|| format!("GET {target}: not JSON"))?;
                Ok(answer["rows"].get(0).cloned())
            }
            404 => Ok(None),
            _ => bail!("GET {target} answered {status}: {}", String::from_utf8_lossy(&body)),
        }
    }
}

/// Writes the home page into `dir` (made if need be), for `onehop serve --static-dir`.
pub fn write_site(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let index = dir.join("index.html");
    std::fs::write(&index, HOME_HTML).with_context(|| format!("writing {}", index.display()))
}

/// The loader's report, for people and (`--json`) for machines.
pub fn report(shop: &Shop, loaded: &Loaded, json: bool) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "shop loaded: {} categories, {} products, {} inventory rows, {} prices, {} reviews ({} rows in {} statements)",
        CATEGORIES.len(),
        shop.products.len(),
        shop.products.len(),
        shop.products.len(),
        shop.reviews.len(),
        loaded.rows,
        loaded.statements
    );
    let _ = writeln!(
        text,
        "written in {:.2} s; the pages matched the data {:.2} s after the start",
        loaded.written.as_secs_f64(),
        loaded.served.as_secs_f64()
    );
    if json {
        let line = json!({
            "workload": "shop-load",
            "categories": CATEGORIES.len(),
            "products": shop.products.len(),
            "reviews": shop.reviews.len(),
            "rows": loaded.rows,
            "statements": loaded.statements,
            "written_s": loaded.written.as_secs_f64(),
            "served_s": loaded.served.as_secs_f64(),
        });
        let _ = writeln!(text, "{line}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_is_the_studys_and_the_seed_decides_it() {
        let shop = Shop::generate(DEFAULT_SEED);
        assert_eq!(shop.products.len(), 1013);
        for (category, (slug, _, count)) in CATEGORIES.iter().enumerate() {
            let ids: Vec<&str> =
                shop.products.iter().filter(|p| p.category == category).map(|p| p.id.as_str()).collect();
            assert_eq!(ids.len(), *count as usize);
            assert_eq!(ids[0], format!("p_{slug}_1"));
        }
        // About one review for every two products, some products with several.
        assert!((400..650).contains(&shop.reviews.len()), "{}", shop.reviews.len());
        assert!(shop.products.iter().all(|p| p.stock < 100 && (1000..11_000).contains(&p.cents)));
        assert_eq!(Shop::generate(DEFAULT_SEED), shop);
        assert_ne!(Shop::generate(DEFAULT_SEED + 1), shop);

        let pages = shop.pages();
        assert_eq!(pages.len(), 1013);
        assert!(pages.windows(2).all(|pair| pair[0]["id"].as_str() < pair[1]["id"].as_str()));
        let several = pages.iter().find(|page| page["review_count"].as_u64() > Some(1)).unwrap();
        let ids: Vec<&str> = several["reviews"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        let none = pages.iter().find(|page| page["review_count"] == 0).unwrap();
        assert_eq!((&none["rating"], &none["reviews"]), (&Value::Null, &json!([])));
        // The whole listing is the study's size: ~380–460 KB of JSON.
        let bytes = serde_json::to_vec(&pages).unwrap().len();
        assert!((300_000..600_000).contains(&bytes), "{bytes}");
    }

    #[test]
    fn answers_compare_by_value_whatever_their_key_order_and_number_form() {
        let from_javascript: Value =
            serde_json::from_str(r#"{"rating": 4, "id": "p1", "reviews": [{"b": 1, "a": 2.5}]}"#).unwrap();
        let from_onehop: Value =
            serde_json::from_str(r#"{"id": "p1", "reviews": [{"a": 2.5, "b": 1.0}], "rating": 4.0}"#).unwrap();
        assert_eq!(canonical(&from_javascript), canonical(&from_onehop));
        assert_ne!(canonical(&from_javascript), canonical(&json!({"id": "p1", "rating": 4.5, "reviews": []})));
    }

    #[test]
    fn text_is_quoted_for_sql() {
        assert_eq!(text("Home & Kitchen"), "'Home & Kitchen'");
        assert_eq!(text("it's"), "'it''s'");
        let inserts = Shop::generate(DEFAULT_SEED).inserts();
        assert!(inserts[0].starts_with("INSERT INTO categories (id, name) VALUES ('electronics', 'Electronics')"));
        assert!(inserts.iter().all(|statement| statement.len() < 200 * 400));
    }
}
