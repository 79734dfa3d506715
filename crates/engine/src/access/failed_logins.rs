//! Password guessing, slowed: failed logins counted per source address, per user and address,
//! and per user, each count giving a backoff.
//!
//! - **An address** that keeps failing, whatever users it names, is refused without a check
//!   for a while that doubles with each failure past [`SOURCE_FREE`], up to [`BLOCK_MS_MAX`].
//! - **A user from one address**: the same, past [`PAIR_FREE`]. This is what stops a client
//!   guessing one user's password, and it never reaches another address: the right password
//!   from elsewhere still logs in.
//! - **A user from everywhere** (guesses spread over many addresses): past [`USER_FREE`] failures
//!   each further attempt for that user waits [`USER_DELAY_MS`] before its check, and is never
//!   refused for it, so the user is slowed, never locked out.
//!
//! A count is forgotten [`FORGET_MS`] after its last failure; a success clears its user and
//! address's count. The maps are bounded ([`ENTRIES_MAX`]): at the bound the oldest entries go.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;

/// Failures from one address (any users) before it is made to wait.
pub const SOURCE_FREE: u32 = 20;
/// Failures for one user from one address before that pair is made to wait.
pub const PAIR_FREE: u32 = 5;
/// Failures for one user from all addresses before each attempt for it is slowed.
pub const USER_FREE: u32 = 50;
/// The first wait; each further failure doubles it.
pub const BLOCK_MS_FIRST: u64 = 500;
/// The longest wait: a forgotten password costs its owner a minute at most.
pub const BLOCK_MS_MAX: u64 = 60_000;
/// How long an attempt for a user under a spread-out attack waits before its check.
pub const USER_DELAY_MS: u64 = 1_000;
/// A count is forgotten this long after its last failure.
pub const FORGET_MS: u64 = 15 * 60 * 1000;
/// Entries each map holds at most, so a flood of names and addresses cannot grow memory.
pub const ENTRIES_MAX: usize = 16_384;

#[derive(Clone, Copy, Debug, Default)]
struct Failures {
    count: u32,
    last_ms: u64,
    /// Refused without a check until then.
    blocked_until_ms: u64,
}

impl Failures {
    fn note(&mut self, now_ms: u64, free: u32) {
        if now_ms.saturating_sub(self.last_ms) > FORGET_MS {
            *self = Failures::default();
        }
        self.count += 1;
        self.last_ms = now_ms;
        if self.count > free {
            let doublings = (self.count - free - 1).min(20);
            let wait = (BLOCK_MS_FIRST << doublings).min(BLOCK_MS_MAX);
            self.blocked_until_ms = now_ms + wait;
        }
    }

    fn current(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ms) <= FORGET_MS
    }
}

/// A map of counts, bounded.
struct Counts<K> {
    entries: HashMap<K, Failures>,
}

impl<K: Eq + Hash + Clone> Counts<K> {
    fn new() -> Self {
        Counts { entries: HashMap::new() }
    }

    fn get(&self, key: &K, now_ms: u64) -> Failures {
        self.entries.get(key).filter(|failures| failures.current(now_ms)).copied().unwrap_or_default()
    }

    fn note(&mut self, key: K, now_ms: u64, free: u32) {
        if self.entries.len() >= ENTRIES_MAX && !self.entries.contains_key(&key) {
            self.entries.retain(|_, failures| failures.current(now_ms));
            if self.entries.len() >= ENTRIES_MAX
                && let Some(oldest) =
                    self.entries.iter().min_by_key(|(_, failures)| failures.last_ms).map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.entry(key).or_default().note(now_ms, free);
    }

    fn clear(&mut self, key: &K) {
        self.entries.remove(key);
    }
}

/// What a login attempt must do before its password is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Check it now.
    Check,
    /// Wait this long, then check it (a user under a spread-out attack).
    CheckAfter(u64),
    /// Refuse it unchecked: its address, or its user from its address, failed too often. The
    /// client may try again after this long.
    Refuse { retry_after_ms: u64 },
}

/// The failed logins of every protocol, shared.
pub struct FailedLogins {
    sources: Mutex<Counts<IpAddr>>,
    pairs: Mutex<Counts<(String, IpAddr)>>,
    users: Mutex<Counts<String>>,
}

impl Default for FailedLogins {
    fn default() -> Self {
        FailedLogins {
            sources: Mutex::new(Counts::new()),
            pairs: Mutex::new(Counts::new()),
            users: Mutex::new(Counts::new()),
        }
    }
}

impl FailedLogins {
    /// What an attempt to log in as `user` from `source` (unknown for some transports) must do.
    pub fn admit(&self, user: &str, source: Option<IpAddr>, now_ms: u64) -> Admission {
        if let Some(source) = source {
            let blocked = self.sources.lock().expect("failed logins lock").get(&source, now_ms).blocked_until_ms.max(
                self.pairs
                    .lock()
                    .expect("failed logins lock")
                    .get(&(user.to_string(), source), now_ms)
                    .blocked_until_ms,
            );
            if blocked > now_ms {
                return Admission::Refuse { retry_after_ms: blocked - now_ms };
            }
        }
        let user_failures = self.users.lock().expect("failed logins lock").get(&user.to_string(), now_ms);
        if user_failures.count > USER_FREE { Admission::CheckAfter(USER_DELAY_MS) } else { Admission::Check }
    }

    /// Counts a failed attempt.
    pub fn failed(&self, user: &str, source: Option<IpAddr>, now_ms: u64) {
        if let Some(source) = source {
            self.sources.lock().expect("failed logins lock").note(source, now_ms, SOURCE_FREE);
            self.pairs.lock().expect("failed logins lock").note((user.to_string(), source), now_ms, PAIR_FREE);
        }
        self.users.lock().expect("failed logins lock").note(user.to_string(), now_ms, USER_FREE);
    }

    /// Clears the count of `user` from `source` after it logged in.
    pub fn succeeded(&self, user: &str, source: Option<IpAddr>) {
        if let Some(source) = source {
            self.pairs.lock().expect("failed logins lock").clear(&(user.to_string(), source));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn one_address_guessing_one_user_waits_longer_each_time_and_another_address_does_not() {
        let logins = FailedLogins::default();
        let now = 1_000_000;
        for _ in 0..PAIR_FREE {
            assert_eq!(logins.admit("alice", address(1), now), Admission::Check);
            logins.failed("alice", address(1), now);
        }
        assert_eq!(logins.admit("alice", address(1), now), Admission::Check, "the free ones are not waited for");
        logins.failed("alice", address(1), now);
        assert_eq!(logins.admit("alice", address(1), now), Admission::Refuse { retry_after_ms: BLOCK_MS_FIRST });
        logins.failed("alice", address(1), now + BLOCK_MS_FIRST);
        let then = now + BLOCK_MS_FIRST;
        assert_eq!(logins.admit("alice", address(1), then), Admission::Refuse { retry_after_ms: 2 * BLOCK_MS_FIRST });
        // Another address, and another user from the first, are not held up.
        assert_eq!(logins.admit("alice", address(2), then), Admission::Check);
        assert_eq!(logins.admit("bob", address(1), then), Admission::Check);
        // The waits stop growing at the maximum, and the count is forgotten later.
        for n in 0..40 {
            logins.failed("alice", address(1), then + n);
        }
        assert_eq!(
            logins.admit("alice", address(1), then + 40),
            Admission::Refuse { retry_after_ms: BLOCK_MS_MAX - 1 }
        );
        assert_eq!(logins.admit("alice", address(1), then + 40 + FORGET_MS + 1), Admission::Check);
        // A success clears the pair.
        logins.failed("alice", address(3), now);
        logins.succeeded("alice", address(3));
        assert_eq!(logins.pairs.lock().unwrap().get(&("alice".into(), address(3).unwrap()), now).count, 0);
    }

    #[test]
    fn guesses_spread_over_addresses_slow_the_user_but_never_refuse_it() {
        let logins = FailedLogins::default();
        let now = 5_000_000;
        for n in 0..=USER_FREE {
            logins.failed("alice", address((n % 200) as u8), now);
        }
        assert_eq!(logins.admit("alice", address(250), now), Admission::CheckAfter(USER_DELAY_MS));
        assert_eq!(logins.admit("bob", address(250), now), Admission::Check);
    }

    #[test]
    fn one_address_naming_many_users_is_refused_and_the_maps_stay_bounded() {
        let logins = FailedLogins::default();
        let now = 9_000_000;
        for n in 0..=SOURCE_FREE {
            logins.failed(&format!("user-{n}"), address(7), now);
        }
        assert!(matches!(logins.admit("someone-else", address(7), now), Admission::Refuse { .. }));
        for n in 0..(ENTRIES_MAX + 10) {
            logins.failed(&format!("flood-{n}"), None, now);
        }
        assert!(logins.users.lock().unwrap().entries.len() <= ENTRIES_MAX);
    }
}
