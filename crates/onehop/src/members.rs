//! `onehop cluster status|add|remove`: a cluster's members through any member's HTTP API
//! (`GET /cluster`, `POST /cluster/nodes`, `DELETE /cluster/nodes/{id}`; docs/cluster.md).

use serde_json::{Value, json};

use crate::cli::ClusterCommand;
use crate::sql::call;

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    let view = match command {
        ClusterCommand::Status { server } => call(&server, reqwest::Method::GET, "/cluster", None)?,
        ClusterCommand::Add { id, address, server } => {
            let body = json!({ "id": id, "address": address.to_string() }).to_string();
            let view = call(&server, reqwest::Method::POST, "/cluster/nodes", Some(body))?;
            println!("node {id} added at {address}");
            view
        }
        ClusterCommand::Remove { id, server } => {
            let view = call(&server, reqwest::Method::DELETE, &format!("/cluster/nodes/{id}"), None)?;
            println!("node {id} removed");
            view
        }
    };
    print!("{}", render(&view));
    Ok(())
}

/// A node's view of the cluster as lines of text.
fn render(view: &Value) -> String {
    let number = |value: &Value| value.as_u64().map_or_else(|| "none".to_string(), |n| n.to_string());
    let members: Vec<String> = view["members"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(id, address)| format!("{id}={}", address.as_str().unwrap_or_default()))
        .collect();
    format!(
        "node {}: {}, term {}, leader {}\nmembers: {}\nlog: last index {}, applied {}, snapshot {}, purged up to {}\n",
        number(&view["node"]),
        view["state"].as_str().unwrap_or("unknown"),
        number(&view["term"]),
        number(&view["leader"]),
        members.join(","),
        number(&view["last_log_index"]),
        number(&view["last_applied"]),
        match view["snapshot_is"].as_str() {
            Some("restarted_from") => format!("{} (restarted from)", number(&view["snapshot_index"])),
            _ => number(&view["snapshot_index"]),
        },
        number(&view["purged_index"]),
    )
}
