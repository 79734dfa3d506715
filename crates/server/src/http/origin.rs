//! The web origins whose pages may use this server through a visitor's browser: one allow-list
//! that CORS and the WebSocket `Origin` check both follow (see [`super::cors`]), and that an
//! authentication layer can ask the same question of.
//!
//! An origin is compared as browsers send it in `Origin`: `scheme://host[:port]`, lower case,
//! without the scheme's default port. Configured origins are brought to that form when they are
//! parsed, so `HTTPS://App.Example.com:443` matches what a browser at that address sends.

use std::fmt;

/// A configured origin that is not one a browser could send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin:?}: {reason}")]
pub struct OriginError {
    pub origin: String,
    pub reason: String,
}

impl OriginError {
    fn new(origin: &str, reason: impl Into<String>) -> Self {
        OriginError { origin: origin.to_string(), reason: reason.into() }
    }
}

/// The origins allowed to use the server from a browser, besides the server's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// These origins, exactly (none by default).
    Listed(Vec<String>),
    /// Every origin (`*`): any page a user opens may read and write through the user's browser.
    Any,
}

impl Default for AllowedOrigins {
    /// None: a page on another origin can neither read from nor write to the server.
    fn default() -> Self {
        AllowedOrigins::Listed(Vec::new())
    }
}

impl AllowedOrigins {
    /// The allow-list from its entries: origins, or `*` alone for every origin. Blank entries
    /// (from `a,,b` or a trailing comma) are passed over.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<AllowedOrigins, OriginError> {
        let entries: Vec<&str> = entries.into_iter().map(str::trim).filter(|entry| !entry.is_empty()).collect();
        if entries.contains(&"*") {
            if let Some(other) = entries.iter().find(|entry| **entry != "*") {
                return Err(OriginError::new(other, "\"*\" already allows every origin; list it alone"));
            }
            return Ok(AllowedOrigins::Any);
        }
        let mut origins = Vec::with_capacity(entries.len());
        for entry in entries {
            let origin = normalize(entry)?;
            if !origins.contains(&origin) {
                origins.push(origin);
            }
        }
        Ok(AllowedOrigins::Listed(origins))
    }

    /// Whether pages from `origin` (an `Origin` header's value) may use the server.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            AllowedOrigins::Any => true,
            AllowedOrigins::Listed(origins) => origins.iter().any(|listed| listed.eq_ignore_ascii_case(origin)),
        }
    }

    /// Whether a request carrying `origin` may be served: its origin is allowed, or it is the
    /// server's own, as the request's `host` names it.
    pub fn admits(&self, origin: &str, host: Option<&str>) -> bool {
        self.allows(origin) || is_same_origin(origin, host)
    }

    /// True when no other origin is allowed (the default).
    pub fn is_none(&self) -> bool {
        matches!(self, AllowedOrigins::Listed(origins) if origins.is_empty())
    }
}

impl fmt::Display for AllowedOrigins {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowedOrigins::Any => formatter.write_str("*"),
            AllowedOrigins::Listed(origins) if origins.is_empty() => formatter.write_str("none"),
            AllowedOrigins::Listed(origins) => formatter.write_str(&origins.join(",")),
        }
    }
}

/// Whether `origin` is the server's own: its `host[:port]` is the one the request was sent to.
///
/// The scheme is not compared: onehop serves plain HTTP, and behind a proxy that ends TLS the
/// page is at `https://` while the request that reaches onehop still names the same host.
pub fn is_same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|authority| !authority.is_empty() && authority.eq_ignore_ascii_case(host))
}

/// `entry` in the form browsers send: lower case, without the scheme's default port.
fn normalize(entry: &str) -> Result<String, OriginError> {
    const FORM: &str = "an origin is scheme://host or scheme://host:port, such as https://app.example.com";
    if entry.eq_ignore_ascii_case("null") {
        return Err(OriginError::new(
            entry,
            "\"null\" is what sandboxed frames and local files send, so any page could claim it; it cannot be allowed",
        ));
    }
    let Some((scheme, rest)) = entry.split_once("://") else {
        return Err(OriginError::new(entry, FORM));
    };
    let scheme_valid = scheme.starts_with(|first: char| first.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !scheme_valid {
        return Err(OriginError::new(entry, FORM));
    }
    let scheme = scheme.to_ascii_lowercase();
    if let Some(end) = rest.find(['/', '?', '#']) {
        return Err(OriginError::new(
            entry,
            format!("an origin has no path, query or trailing slash: write {scheme}://{}", &rest[..end]),
        ));
    }
    if rest.contains('*') {
        return Err(OriginError::new(
            entry,
            "origins are matched exactly: list each one (\"*\" alone allows every origin)",
        ));
    }
    if !rest.is_ascii() {
        return Err(OriginError::new(entry, "write a non-ASCII host in its xn-- form, as browsers send it"));
    }
    let (host, port) = split_host_port(rest).ok_or_else(|| OriginError::new(entry, FORM))?;
    let host_valid = if host.starts_with('[') {
        host.len() > 2 && host[1..host.len() - 1].chars().all(|c| c.is_ascii_hexdigit() || ".:".contains(c))
    } else {
        !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
    };
    if !host_valid {
        return Err(OriginError::new(entry, FORM));
    }
    let host = host.to_ascii_lowercase();
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => return Err(OriginError::new(entry, "the port is a number from 1 to 65535")),
        },
    };
    let default_port = match scheme.as_str() {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    };
    Ok(match port {
        Some(port) if Some(port) != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// `host[:port]`, the host an IPv6 address in brackets or a name; `None` when a colon leaves
/// nothing after it.
fn split_host_port(authority: &str) -> Option<(&str, Option<&str>)> {
    if authority.contains('@') || authority.chars().any(char::is_whitespace) {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, after) = authority.split_at(end + 1);
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if port.is_some_and(|port| port.is_empty() || !port.bytes().all(|byte| byte.is_ascii_digit())) {
        return None;
    }
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[&str]) -> Result<AllowedOrigins, OriginError> {
        AllowedOrigins::parse(entries.iter().copied())
    }

    #[test]
    fn origins_are_kept_as_browsers_send_them() {
        let allowed = parse(&[
            "HTTPS://App.Example.com:443",
            "http://127.0.0.1:5173",
            "http://[::1]:80",
            "tauri://localhost",
            " ",
        ])
        .unwrap();
        assert_eq!(allowed.to_string(), "https://app.example.com,http://127.0.0.1:5173,http://[::1],tauri://localhost");
        assert!(allowed.allows("https://app.example.com"));
        assert!(allowed.allows("http://127.0.0.1:5173"));
        assert!(allowed.allows("http://[::1]"));
        // Exact: another scheme, port, or a subdomain is another origin.
        for other in ["http://app.example.com", "https://app.example.com:8443", "https://evil.app.example.com"] {
            assert!(!allowed.allows(other), "{other}");
        }
        assert!(!allowed.allows("null"));
    }

    #[test]
    fn the_default_allows_no_other_origin_and_star_allows_all() {
        let none = AllowedOrigins::default();
        assert!(none.is_none() && !none.allows("http://127.0.0.1:5173"));
        assert_eq!(none.to_string(), "none");
        assert_eq!(parse(&[]).unwrap(), none);
        let any = parse(&["*"]).unwrap();
        assert!(!any.is_none() && any.allows("https://anything.example") && any.allows("null"));
    }

    #[test]
    fn entries_no_browser_sends_are_refused_with_the_reason() {
        for (entry, reason) in [
            ("https://app.example.com/", "write https://app.example.com"),
            ("https://app.example.com/path?x", "no path"),
            ("app.example.com", "scheme://host"),
            ("https://*.example.com", "matched exactly"),
            ("null", "sandboxed"),
            ("https://app.example.com:0", "port"),
            ("https://app.example.com:65536", "port"),
            ("https://app.example.com:", "scheme://host"),
            ("https://user@app.example.com", "scheme://host"),
            ("https://", "scheme://host"),
            ("1http://x", "scheme://host"),
            ("https://bücher.example", "xn--"),
        ] {
            let error = parse(&[entry]).unwrap_err();
            assert_eq!(error.origin, entry);
            assert!(error.to_string().contains(reason), "{entry}: {error}");
        }
        let error = parse(&["*", "https://app.example.com"]).unwrap_err();
        assert!(error.to_string().contains("list it alone"), "{error}");
    }

    #[test]
    fn the_servers_own_origin_is_admitted_by_its_host() {
        let none = AllowedOrigins::default();
        assert!(none.admits("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        // Behind a proxy that ends TLS.
        assert!(none.admits("https://onehop.example.com", Some("onehop.example.com")));
        assert!(!none.admits("http://127.0.0.1:8081", Some("127.0.0.1:8080")));
        assert!(!none.admits("http://localhost:8080", Some("127.0.0.1:8080")));
        assert!(!none.admits("http://127.0.0.1:8080", None));
        assert!(!none.admits("null", Some("null")));
        assert!(!none.admits("http://", Some("")));
    }
}
