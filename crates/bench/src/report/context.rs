//! What every report carries: facts about the machine and the build gathered once per invocation,
//! times in RFC 3339, and the id of each run.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

/// Facts about the machine and the build, gathered once per invocation.
pub struct Context {
    pub host_info: serde_json::Value,
    pub git_sha: String,
    pub git_dirty: Option<bool>,
    pub command: String,
}

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|text| text.trim().to_string())
}

impl Context {
    /// `exe` locates the source tree for the git revision (the binary is built inside it).
    pub fn gather(exe: &Path, command: &str) -> Context {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_string())
        });
        let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
        });
        let host_info = json!({
            "hostname": first_line("/proc/sys/kernel/hostname"),
            "os": std::env::consts::OS,
            "kernel": first_line("/proc/sys/kernel/osrelease"),
            "cpu_model": cpu_model,
            "cpus": std::thread::available_parallelism().map_or(0, |count| count.get()),
            "memory_bytes": memory_bytes,
            "harness_build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "harness_version": env!("CARGO_PKG_VERSION"),
        });
        let directory = exe.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(&directory)
                .args(args)
                .output()
                .ok()
                .filter(|output| output.status.success())
                .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        };
        let git_sha = git(&["rev-parse", "HEAD"]).filter(|sha| !sha.is_empty()).unwrap_or_else(|| "unknown".into());
        let git_dirty = git(&["status", "--porcelain", "--untracked-files=no"]).map(|status| !status.is_empty());
        Context { host_info, git_sha, git_dirty, command: command.to_string() }
    }
}

/// RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs() as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// `20261121T101500Z-onehop-50hz-r1`: sortable, unique per run of an invocation.
pub fn run_id(started_at: SystemTime, target: &str, rate_hz: f64, run: u32) -> String {
    let stamp: String = rfc3339(started_at)[..19].chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect();
    format!("{stamp}Z-{target}-{rate_hz:.0}hz-r{run}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let time = UNIX_EPOCH + std::time::Duration::from_millis(1_795_255_200_250);
        assert_eq!(rfc3339(time), "2026-11-21T10:00:00.250Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(run_id(time, "onehop", 50.0, 2), "20261121T100000Z-onehop-50hz-r2");
    }
}
