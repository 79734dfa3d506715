//! The onehop target: a `onehop serve` this harness starts, or a running one; and the same
//! server with access on, TLS on, or both (`onehop-auth`, `onehop-tls`, `onehop-secure`), so
//! one invocation shows what they cost beside the plain server.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::{Session, Target, TargetOptions};
use crate::client::{self, Endpoints, Login, Security, TlsListeners, tls::TlsClient};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::server::ServerProcess;

/// What a started onehop asks of its clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Protection {
    /// Access on: a superuser defined at start, every measured client logged in as a user
    /// that is not one.
    pub access: bool,
    /// HTTPS and MQTT over TLS, the measured clients on those listeners.
    pub tls: bool,
}

impl Protection {
    /// The protection of the target called `name`, if it is a onehop target.
    pub fn of_target(name: &str) -> Option<Protection> {
        match name {
            "onehop" => Some(Protection { access: false, tls: false }),
            "onehop-auth" => Some(Protection { access: true, tls: false }),
            "onehop-tls" => Some(Protection { access: false, tls: true }),
            "onehop-secure" => Some(Protection { access: true, tls: true }),
            _ => None,
        }
    }

    fn target_name(self) -> &'static str {
        match (self.access, self.tls) {
            (false, false) => "onehop",
            (true, false) => "onehop-auth",
            (false, true) => "onehop-tls",
            (true, true) => "onehop-secure",
        }
    }
}

/// The superuser a protected target starts its server with; it makes the definitions.
const ADMIN_USER: &str = "bench_admin";
/// The user every measured client logs in as.
const CLIENT_USER: &str = "bench";
/// What the measured clients' user may do: what the workloads' clients do, and no more.
/// Streams and views are defined by the superuser.
const CLIENT_GRANTS: [&str; 2] = ["READ, WRITE ON ALL STREAMS", "READ ON ALL VIEWS"];

pub struct OnehopTarget {
    protection: Protection,
    endpoints: Endpoints,
    settings: serde_json::Value,
    /// The server this target started (stopped on drop), or `None` for `--url`.
    process: Option<ServerProcess>,
    /// The certificates made for this invocation, removed on drop.
    _certificates: Option<tempfile::TempDir>,
}

impl OnehopTarget {
    /// The plain server: access and TLS off.
    pub fn start(options: &TargetOptions) -> anyhow::Result<OnehopTarget> {
        OnehopTarget::start_protected(options, Protection::default())
    }

    pub fn start_protected(options: &TargetOptions, protection: Protection) -> anyhow::Result<OnehopTarget> {
        if protection != Protection::default() {
            return OnehopTarget::start_guarded(options, protection);
        }
        let settings = json!({ "access": "off", "tls": "off", "credentials": "none" });
        if let Some(url) = &options.url {
            let url = url.trim_end_matches('/').to_string();
            let mqtt = match &options.mqtt_address {
                Some(address) => address.clone(),
                None => {
                    let host = url.split("://").nth(1).unwrap_or(&url).split([':', '/']).next().unwrap_or_default();
                    format!("{host}:1883")
                }
            };
            let endpoints = Endpoints::plain(url, mqtt);
            return Ok(OnehopTarget { protection, endpoints, settings, process: None, _certificates: None });
        }
        if let Some(address) = &options.mqtt_address {
            // A broker's address alone: MQTT workloads only, with the server's default durability.
            let endpoints = Endpoints::plain(String::new(), address.clone());
            return Ok(OnehopTarget { protection, endpoints, settings, process: None, _certificates: None });
        }
        let process = ServerProcess::start(&options.exe, &options.dir, &[])
            .with_context(|| format!("starting {} serve", options.exe.display()))?;
        let endpoints = Endpoints::plain(process.url.clone(), process.mqtt.clone());
        Ok(OnehopTarget { protection, endpoints, settings, process: Some(process), _certificates: None })
    }

    /// Starts a server with access, TLS or both on, sets up the measured clients' user and
    /// credentials, and checks that the server refuses a client that presents none.
    fn start_guarded(options: &TargetOptions, protection: Protection) -> anyhow::Result<OnehopTarget> {
        let name = protection.target_name();
        if options.url.is_some() || options.mqtt_address.is_some() {
            bail!(
                "{name} starts a server of its own, with its own users and certificate: it cannot be used with --url"
            );
        }
        let certificates = if protection.tls {
            let directory = tempfile::Builder::new().prefix("onehop-bench-tls-").tempdir_in(&options.dir)?;
            make_certificates(directory.path()).context("making a certificate for this invocation")?;
            Some(directory)
        } else {
            None
        };
        let mut args: Vec<String> = Vec::new();
        if let Some(directory) = &certificates {
            args.extend(["--https-addr", "127.0.0.1:0", "--mqtt-tls-addr", "127.0.0.1:0"].map(String::from));
            args.extend(["--tls-cert".into(), path_text(&directory.path().join("server.pem"))?]);
            args.extend(["--tls-key".into(), path_text(&directory.path().join("server.key"))?]);
        }
        let admin_password = secret()?;
        if protection.access {
            args.extend(["--admin-user".to_string(), ADMIN_USER.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: &[(&str, &str)] = if protection.access { &[("ONEHOP_ADMIN_PASSWORD", &admin_password)] } else { &[] };
        let process = ServerProcess::start_with_env(&options.exe, &options.dir, &args, env)
            .with_context(|| format!("starting {} serve for {name}", options.exe.display()))?;
        let tls = match &certificates {
            Some(directory) => {
                let (Some(https), Some(mqtts)) = (process.https.clone(), process.mqtts.clone()) else {
                    bail!("the server did not say where its HTTPS and MQTT-over-TLS listeners are");
                };
                let client = TlsClient::trusting(&directory.path().join("ca.pem"), "127.0.0.1")?;
                Some(TlsListeners { https, mqtts, client })
            }
            None => None,
        };
        let mut endpoints = Endpoints {
            http: process.url.clone(),
            mqtt: process.mqtt.clone(),
            security: Security { setup_authorization: None, login: None, tls },
            publish_to: Vec::new(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        if protection.access {
            let (setup_authorization, login) = runtime.block_on(log_in(&process.url, &admin_password))?;
            endpoints.security.setup_authorization = Some(setup_authorization);
            endpoints.security.login = Some(login);
        }
        let mut settings = json!({
            "access": if protection.access { "on" } else { "off" },
            "tls": if protection.tls { "on" } else { "off" },
            "credentials": if protection.access {
                "a bearer token from CREATE TOKEN in every HTTP request and SSE and WebSocket subscription \
                 (Authorization: Bearer); a user name and password in every MQTT CONNECT"
            } else {
                "none"
            },
            "connections": "keep-alive: HTTP writers open 4 connections and subscribers theirs before the \
                schedule starts, so no TLS handshake falls in a measured window",
            "definitions": "made over plain HTTP (by the superuser when access is on): not measured",
        });
        if protection.access {
            let grants = CLIENT_GRANTS.join("; ");
            settings["user"] = json!(format!("{CLIENT_USER}, not a superuser: {grants}"));
            settings["anonymous_refused"] = anonymous_refusals(&endpoints)?;
        }
        if let Some(tls) = &endpoints.security.tls {
            settings["tls_session"] = json!(negotiated(tls)?);
            settings["tls_certificate"] = json!(
                "ECDSA P-256 for IP 127.0.0.1, signed by a CA made for this invocation (openssl), trusted by the clients"
            );
            settings["tls_listeners"] = json!("HTTPS (HTTP/1.1, no ALPN) and MQTT over TLS; TLS 1.2 and 1.3 offered");
        }
        Ok(OnehopTarget { protection, endpoints, settings, process: Some(process), _certificates: certificates })
    }

    pub fn mqtt_address(&self) -> &str {
        &self.endpoints.mqtt
    }

    /// The server's `/metrics`, read over plain HTTP as the superuser when access is on. A
    /// server that does not answer in time leaves the run without the figure, not the harness
    /// waiting.
    fn metrics(&self, runtime: &Handle) -> Option<String> {
        let url = format!("{}/metrics", self.endpoints.http);
        let authorization = self.endpoints.security.setup_authorization.clone();
        runtime.block_on(async {
            let mut request = client::http::client().ok()?.get(&url).timeout(std::time::Duration::from_secs(5));
            if let Some(authorization) = authorization {
                request = request.header("authorization", authorization);
            }
            let response = request.send().await.ok()?;
            response.error_for_status().ok()?.text().await.ok()
        })
    }
}

impl Target for OnehopTarget {
    fn name(&self) -> &str {
        self.protection.target_name()
    }

    fn durability(&self, plan: &Plan) -> String {
        // The stream is created with this durability; a write is answered once it holds.
        plan.durability().to_string()
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        client::open(&self.endpoints, plan, recorder, runtime)
    }

    fn server_pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }

    fn fsyncs(&self, runtime: &Handle) -> Option<crate::fsyncs::Fsyncs> {
        // The whole server's: with --url, other clients' writes count too.
        crate::fsyncs::Fsyncs::parse(&self.metrics(runtime)?)
    }

    fn refusals(&self, runtime: &Handle) -> Option<u64> {
        Some(refusals_in(&self.metrics(runtime)?))
    }
}

/// Failed logins and failed TLS handshakes in a `/metrics` text, every protocol summed.
fn refusals_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("auth_failures_total") || line.starts_with("tls_handshake_failures_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Logs in as the superuser (Basic, once), creates the measured clients' user with its grants,
/// and tokens for both. Returns the superuser's `Authorization` value and the client's login.
async fn log_in(url: &str, admin_password: &str) -> anyhow::Result<(String, Login)> {
    let http = client::http::client()?;
    let password = secret()?;
    let grants: Vec<String> = CLIENT_GRANTS.iter().map(|grant| format!("GRANT {grant} TO {CLIENT_USER}")).collect();
    let statements = format!(
        "CREATE USER {CLIENT_USER} PASSWORD '{password}'; {}; \
         CREATE TOKEN FOR {CLIENT_USER} VALID FOR '7d'; CREATE TOKEN FOR {ADMIN_USER} VALID FOR '7d'",
        grants.join("; ")
    );
    let response = http
        .post(format!("{url}/sql"))
        .basic_auth(ADMIN_USER, Some(admin_password))
        .body(statements.clone())
        .send()
        .await
        .with_context(|| format!("reaching the server at {url}"))?;
    if !response.status().is_success() {
        bail!("{statements}: {}", response.text().await.unwrap_or_default());
    }
    let answer: serde_json::Value = response.json().await?;
    let tokens = tokens_in(&answer);
    let [client_token, admin_token] = tokens.as_slice() else {
        bail!("CREATE TOKEN did not answer two tokens: {answer}");
    };
    let login = Login { token: client_token.clone(), user: CLIENT_USER.into(), password };
    Ok((format!("Bearer {admin_token}"), login))
}

/// The secrets of the `CREATE TOKEN` results in an answer of `POST /sql`, in order.
fn tokens_in(answer: &serde_json::Value) -> Vec<String> {
    let results = answer["results"].as_array().map(Vec::as_slice).unwrap_or_default();
    results
        .iter()
        .filter_map(|result| {
            let columns = result["columns"].as_array()?;
            let column = columns.iter().position(|name| name == "token")?;
            Some(result["rows"][0][column].as_str()?.to_string())
        })
        .collect()
}

/// Checks that the measured listeners refuse a client that presents no credentials: an HTTP
/// write is answered 401 and an MQTT CONNECT is refused. Otherwise the figures would not be
/// those of a server with access on.
fn anonymous_refusals(endpoints: &Endpoints) -> anyhow::Result<serde_json::Value> {
    let dial = endpoints.http_dial();
    let (mut writer, mut reader) = dial.connect().with_context(|| format!("connecting to {}", dial.address))?;
    let stream = client::unique_name("bench_probe");
    let request =
        client::http1::request("POST", &dial.address, &format!("/streams/{stream}"), None, None, b"{\"probe\":true}");
    writer.write_all(&request)?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let status = loop {
        let (read, _) = reader.read(&mut chunk)?;
        if read == 0 {
            bail!("the server closed the connection before answering an anonymous write");
        }
        bytes.extend_from_slice(&chunk[..read]);
        if let Some(head) = client::http1::parse_head(&bytes).map_err(anyhow::Error::msg)? {
            break head.status;
        }
    };
    if status != 401 {
        bail!("access is not on: an anonymous write to {} was answered {status}, not 401", dial.address);
    }
    let mqtt = match client::mqtt::Connection::open_with(&endpoints.mqtt_dial(), "bench-anonymous-probe", None) {
        Ok(_) => bail!("access is not on: MQTT accepted an anonymous CONNECT"),
        Err(error) => format!("{error:#}"),
    };
    if !mqtt.contains("NotAuthorized") {
        bail!("an anonymous MQTT CONNECT failed, but not as refused: {mqtt}");
    }
    Ok(json!({ "http": status, "mqtt": "CONNACK 5 (not authorized)" }))
}

/// The protocol version and cipher suite the HTTPS listener agrees on with the clients.
fn negotiated(tls: &TlsListeners) -> anyhow::Result<String> {
    let mut socket = std::net::TcpStream::connect(&tls.https)?;
    let session = tls.client.handshake(&mut socket).context("a TLS handshake with the HTTPS listener")?;
    Ok(client::tls::describe(&session))
}

/// A CA (`ca.pem`) and a certificate for IP 127.0.0.1 it signed (`server.pem`, its key
/// `server.key`) in `directory`: P-256, valid for a day, made with openssl for this invocation.
fn make_certificates(directory: &Path) -> anyhow::Result<()> {
    let openssl = |args: &[&str]| -> anyhow::Result<()> {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(directory)
            .output()
            .context("running openssl (the TLS targets make their certificate with it: apt-get install openssl)")?;
        if !output.status.success() {
            bail!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
        }
        Ok(())
    };
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let ca = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=onehop bench CA"];
    openssl(&[&["req", "-x509"][..], &key, &ca].concat())?;
    let request = ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"];
    openssl(&[&["req"][..], &key, &request].concat())?;
    std::fs::write(directory.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ])
}

/// 32 random hex digits, for a password made for this invocation.
fn secret() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

fn path_text(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_string).with_context(|| format!("{} is not UTF-8", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_found_by_column_and_refusals_summed_over_protocols() {
        let answer = json!({ "results": [
            { "columns": ["ok"], "rows": [[true]] },
            { "columns": ["id", "user", "token", "expires_ms"], "rows": [["a1", "bench", "oht_a1_x", 1]] },
            { "columns": ["id", "user", "token", "expires_ms"], "rows": [["b2", "bench_admin", "oht_b2_y", 1]] },
        ]});
        assert_eq!(tokens_in(&answer), ["oht_a1_x", "oht_b2_y"]);
        let metrics = "# TYPE auth_failures_total counter\nauth_failures_total{protocol=\"http\"} 2\n\
                       auth_failures_total{protocol=\"mqtt\"} 1\ntls_handshake_failures_total{protocol=\"https\"} 3\n\
                       http_requests_total{status=\"401\"} 9\n";
        assert_eq!(refusals_in(metrics), 6);
        for name in ["onehop", "onehop-auth", "onehop-tls", "onehop-secure"] {
            assert_eq!(Protection::of_target(name).unwrap().target_name(), name);
        }
    }
}
