//! Static files: `--static-dir DIR` serves a directory's files on the HTTP listener, for GET
//! and HEAD of any path no data route takes, so an application's pages come from the server
//! that holds their data.
//!
//! - A path is taken segment by segment, each percent-decoded. A segment that is `..` or `.`,
//!   starts with a dot (`.env`, `.git`), or holds `/`, `\` or NUL once decoded finds nothing;
//!   so does a symbolic link leading out of the directory (the file's own path, links
//!   resolved, must be inside it).
//! - `/` and a path ending in `/` serve that directory's `index.html`; a directory named
//!   without its slash is redirected (308) to the path with it, so its pages' relative links
//!   work.
//! - `Content-Type` by extension (`application/octet-stream` for others), with
//!   `X-Content-Type-Options: nosniff`; `ETag` and `Last-Modified` from the file's length and
//!   time, `If-None-Match` answered 304, and `Cache-Control: no-cache`: a browser asks again
//!   each time, so a changed file is seen at once.
//! - The body is read from the file as it is sent, never whole in memory.
//! - No credentials are asked: a page loads before its script can log in. What the page then
//!   reads and writes goes through the data routes and their grants.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use tokio_util::io::ReaderStream;

/// The directory files are served from.
#[derive(Debug)]
pub struct StaticFiles {
    /// Its canonical path (links resolved): every file served is under it.
    root: PathBuf,
}

/// What a path finds.
enum Found {
    File(PathBuf, std::fs::Metadata),
    /// A directory asked for without its trailing slash.
    Directory,
    Nothing,
}

impl StaticFiles {
    /// The files of `dir`, which must be a directory.
    pub fn new(dir: &Path) -> std::io::Result<StaticFiles> {
        let root = dir.canonicalize()?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(StaticFiles { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The answer to `method uri`, or `None` when the directory has nothing there.
    pub async fn serve(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Response> {
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        let path = uri.path().to_string();
        let root = self.root.clone();
        let found = tokio::task::spawn_blocking(move || find(&root, &path)).await.ok()?;
        let (file, metadata) = match found {
            Found::Nothing => return None,
            Found::Directory => {
                let mut location = format!("{}/", uri.path());
                if let Some(query) = uri.query() {
                    location.push('?');
                    location.push_str(query);
                }
                return Some((StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, location)]).into_response());
            }
            Found::File(file, metadata) => (file, metadata),
        };
        let modified = metadata.modified().ok();
        let since_epoch = modified.and_then(|time| time.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
        let etag = format!("\"{:x}-{:x}\"", metadata.len(), since_epoch.as_nanos());
        let mut response_headers = HeaderMap::new();
        response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(&file)));
        response_headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Ok(value) = HeaderValue::from_str(&etag) {
            response_headers.insert(header::ETAG, value);
        }
        if let Some(modified) = modified
            && let Ok(value) = HeaderValue::from_str(&http_date(modified))
        {
            response_headers.insert(header::LAST_MODIFIED, value);
        }
        let unchanged = headers.get_all(header::IF_NONE_MATCH).iter().any(|value| {
            value.to_str().is_ok_and(|tags| {
                tags.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
            })
        });
        if unchanged {
            return Some((StatusCode::NOT_MODIFIED, response_headers).into_response());
        }
        response_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(metadata.len()));
        if method == Method::HEAD {
            return Some((StatusCode::OK, response_headers).into_response());
        }
        let opened = match tokio::fs::File::open(&file).await {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(file = %file.display(), %error, "a static file could not be opened");
                return None;
            }
        };
        let body = Body::from_stream(ReaderStream::new(opened));
        Some((StatusCode::OK, response_headers, body).into_response())
    }
}

/// The file `path` (a request's path, still percent-encoded) names under `root`.
fn find(root: &Path, path: &str) -> Found {
    let mut file = root.to_path_buf();
    let trailing_slash = path.ends_with('/');
    for raw in path.split('/').filter(|segment| !segment.is_empty()) {
        let Ok(segment) = super::query::decode(raw, false) else { return Found::Nothing };
        let refused = segment.starts_with('.') || segment.contains(['/', '\\', '\0']);
        if refused {
            return Found::Nothing;
        }
        file.push(segment);
    }
    let Ok(real) = file.canonicalize() else { return Found::Nothing };
    if !real.starts_with(root) {
        return Found::Nothing;
    }
    let Ok(metadata) = std::fs::metadata(&real) else { return Found::Nothing };
    if metadata.is_dir() {
        if !trailing_slash && real != root {
            return Found::Directory;
        }
        let index = real.join("index.html");
        return match std::fs::metadata(&index) {
            Ok(metadata) if metadata.is_file() => Found::File(index, metadata),
            _ => Found::Nothing,
        };
    }
    if !metadata.is_file() {
        return Found::Nothing;
    }
    Found::File(real, metadata)
}

/// The media type of a file, by its extension.
fn content_type(file: &Path) -> &'static str {
    let extension = file.extension().and_then(|extension| extension.to_str()).unwrap_or("").to_ascii_lowercase();
    match extension.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" | "map" => "application/json",
        "txt" | "md" => "text/plain; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "xml" => "application/xml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "avif" => "image/avif",
        "ico" => "image/x-icon",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "otf" => "font/otf",
        "wasm" => "application/wasm",
        "pdf" => "application/pdf",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "webmanifest" => "application/manifest+json",
        _ => "application/octet-stream",
    }
}

/// `time` as HTTP writes dates (RFC 9110's IMF-fixdate), in UTC.
fn http_date(time: std::time::SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let seconds = time.duration_since(UNIX_EPOCH).map(|since| since.as_secs()).unwrap_or(0);
    // RFC 3339 (`2026-12-03T08:49:37Z`) has the date's parts in place.
    let stamp = humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(seconds)).to_string();
    let month = stamp.get(5..7).and_then(|month| month.parse::<usize>().ok()).unwrap_or(1);
    format!(
        "{}, {} {} {} {} GMT",
        DAYS[(seconds / 86_400 % 7) as usize],
        &stamp[8..10],
        MONTHS[month.clamp(1, 12) - 1],
        &stamp[0..4],
        &stamp[11..19]
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_are_written_as_http_writes_them() {
        let at = |seconds: u64| http_date(UNIX_EPOCH + Duration::from_secs(seconds));
        assert_eq!(at(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(at(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(at(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(at(1_796_256_000), "Thu, 03 Dec 2026 00:00:00 GMT");
    }

    #[test]
    fn paths_stay_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("index.html"), "<p>home</p>").unwrap();
        std::fs::create_dir(root.join("docs")).unwrap();
        std::fs::write(root.join("docs/index.html"), "<p>docs</p>").unwrap();
        std::fs::write(root.join("a b.txt"), "spaced").unwrap();
        std::fs::write(root.join(".env"), "SECRET=1").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(root.join("a b.txt"), root.join("inside.txt")).unwrap();
        let name = |found: Found| match found {
            Found::File(file, _) => file.strip_prefix(&root).unwrap().display().to_string(),
            Found::Directory => "directory".into(),
            Found::Nothing => "nothing".into(),
        };
        assert_eq!(name(find(&root, "/")), "index.html");
        assert_eq!(name(find(&root, "/docs/")), "docs/index.html");
        assert_eq!(name(find(&root, "/docs")), "directory");
        assert_eq!(name(find(&root, "/a%20b.txt")), "a b.txt");
        assert_eq!(name(find(&root, "/inside.txt")), "a b.txt");
        for refused in [
            "/.env",
            "/docs/../.env",
            "/../secret.txt",
            "/%2e%2e/secret.txt",
            "/docs/%2e%2e%2f.env",
            "/link.txt",
            "/a%00b",
            "/docs%5c..%5cindex.html",
            "/%zz",
            "/missing.html",
        ] {
            assert_eq!(name(find(&root, refused)), "nothing", "{refused}");
        }
    }
}
