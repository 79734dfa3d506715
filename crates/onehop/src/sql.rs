//! `onehop sql`: send statements to a running server's `POST /sql` and print what they did.

use anyhow::{Context, bail};
use serde_json::Value;

use crate::cli::{ServerArgs, SqlArgs};

/// Sends one request to the server `server` names, as its user: the JSON answer, or the error
/// the server gave (its message and code).
pub fn call(server: &ServerArgs, method: reqwest::Method, path: &str, body: Option<String>) -> anyhow::Result<Value> {
    let url = format!("{}{path}", server.url.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (status, answer) = runtime.block_on(async {
        let mut request = reqwest::Client::new().request(method, &url);
        if let Some(body) = body {
            request = request.body(body);
        }
        if let Some(user) = &server.user {
            let password = std::env::var("ONEHOP_PASSWORD")
                .map_err(|_| anyhow::anyhow!("--user {user} needs its password in ONEHOP_PASSWORD"))?;
            request = request.basic_auth(user, Some(password));
        } else if let Some(token) = &server.token {
            request = request.bearer_auth(token);
        }
        let response =
            request.send().await.with_context(|| format!("cannot reach {url}: is `onehop serve` running there?"))?;
        let status = response.status();
        let answer: Value = response.json().await.with_context(|| format!("{url} did not answer with JSON"))?;
        anyhow::Ok((status, answer))
    })?;
    if !status.is_success() {
        let message = answer["error"]["message"].as_str().unwrap_or("unknown error");
        let code = answer["error"]["code"].as_str().unwrap_or("error");
        bail!("{message} ({code})");
    }
    Ok(answer)
}

pub fn run(args: SqlArgs) -> anyhow::Result<()> {
    let sql = match (&args.sql, &args.file) {
        (Some(sql), _) => sql.clone(),
        (None, Some(file)) => std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?,
        (None, None) => bail!("give the statements, or --file"),
    };
    let answer = call(&args.server, reqwest::Method::POST, "/sql", Some(sql))?;
    for result in answer["results"].as_array().into_iter().flatten() {
        print!("{}", render(result));
    }
    Ok(())
}

/// One statement's result as text: a line for definitions, an aligned table for rows.
fn render(result: &Value) -> String {
    let statement = result["statement"].as_str().unwrap_or_default();
    match result["result"].as_str() {
        Some("created") => format!("{statement}: created ({})\n", result["definition"].as_str().unwrap_or_default()),
        Some("unchanged") => format!("{statement}: unchanged; {}\n", result["note"].as_str().unwrap_or_default()),
        Some("altered") => format!("{statement}: altered ({})\n", result["definition"].as_str().unwrap_or_default()),
        Some("dropped") => format!("{statement}: dropped\n"),
        Some("changed") => {
            let rows = result["rows"].as_u64().unwrap_or(0);
            format!("{} {rows} row{}\n", result["verb"].as_str().unwrap_or_default(), if rows == 1 { "" } else { "s" })
        }
        Some("rows") => {
            let columns: Vec<String> = result["columns"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|column| column.as_str().unwrap_or_default().to_string())
                .collect();
            let cell = |value: &Value| match value {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            let rows: Vec<Vec<String>> = result["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|row| row.as_array().into_iter().flatten().map(cell).collect())
                .collect();
            let widths: Vec<usize> = (0..columns.len())
                .map(|i| {
                    rows.iter()
                        .map(|row| row.get(i).map_or(0, String::len))
                        .chain([columns[i].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: &[String]| {
                let padded: Vec<String> =
                    cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
                format!("{}\n", padded.join("  ").trim_end())
            };
            let mut text = line(&columns);
            text.push_str(&line(&widths.iter().map(|width| "-".repeat(*width)).collect::<Vec<_>>()));
            for row in &rows {
                text.push_str(&line(row));
            }
            text.push_str(&format!("({} row{})\n", rows.len(), if rows.len() == 1 { "" } else { "s" }));
            text
        }
        _ => format!("{result}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_render_as_an_aligned_table() {
        let result = json!({
            "result": "rows", "statement": "SHOW STREAMS",
            "columns": ["name", "partitions", "retention_ms"],
            "rows": [["orders", 4, null], ["clicks-long-name", 1, 3600000]]
        });
        assert_eq!(
            render(&result),
            "name              partitions  retention_ms\n\
             ----------------  ----------  ------------\n\
             orders            4\n\
             clicks-long-name  1           3600000\n\
             (2 rows)\n"
        );
        let created = json!({ "result": "created", "statement": "CREATE STREAM s", "definition": "partitions = 1" });
        assert_eq!(render(&created), "CREATE STREAM s: created (partitions = 1)\n");
        let altered = json!({ "result": "altered", "statement": "ALTER STREAM s", "definition": "retention_ms = 1" });
        assert_eq!(render(&altered), "ALTER STREAM s: altered (retention_ms = 1)\n");
    }
}
