//! The ledger itself: balances, the transfers that change them, and the transaction log's
//! records. No I/O here, so every rule (dedupe, overdraft, sequence continuity) is tested
//! directly.
//!
//! The leader *decides* a transfer: it numbers it with the next sequence and applies it, or
//! says it was applied already. The standby *replays* the transactions the leader committed,
//! in log order: it recomputes each outcome from its own balances and refuses a gap or an
//! outcome that differs, so two ledgers that agree on the log agree on every balance.

use std::fmt::Write;

use serde::Deserialize;

/// A command: move `amount` from account `from` to account `to`. `command` identifies it
/// across retries: the generator sends ids 1, 2, 3… in order and re-sends the same id after a
/// failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub command: u64,
    pub from: u32,
    pub to: u32,
    pub amount: u64,
}

/// A transfer the leader numbered: `seq` is its place in the log (1, 2, 3… with no gap), and
/// `accepted` says whether it moved money (false: it would have overdrawn `from`, and is
/// recorded as rejected, so the outcome is part of the log and every replica agrees on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transaction {
    pub seq: u64,
    pub transfer: Transfer,
    pub accepted: bool,
}

/// A rule the ledger refuses to break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// A transaction that is not the next one: a record of the log is missing.
    Gap {
        expected: u64,
        got: u64,
    },
    /// A command id beyond the next one: a command was lost between generator and ledger.
    CommandGap {
        expected: u64,
        got: u64,
    },
    /// The log says a transfer was accepted (or rejected) and these balances say otherwise.
    OutcomeDiffers {
        seq: u64,
        logged: bool,
    },
    UnknownAccount {
        seq: u64,
        account: u32,
    },
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Gap { expected, got } => {
                write!(formatter, "a gap in the log: expected sequence {expected}, got {got}")
            }
            LedgerError::CommandGap { expected, got } => {
                write!(formatter, "a command went missing: expected command {expected}, got {got}")
            }
            LedgerError::OutcomeDiffers { seq, logged } => write!(
                formatter,
                "sequence {seq} is logged as {} but these balances {} it",
                if *logged { "accepted" } else { "rejected" },
                if *logged { "reject" } else { "accept" }
            ),
            LedgerError::UnknownAccount { seq, account } => {
                write!(formatter, "sequence {seq} names account {account}, which does not exist")
            }
        }
    }
}

impl std::error::Error for LedgerError {}

/// What replaying one logged transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed {
    Applied,
    /// Its sequence was applied already (a batch committed twice after an unknown outcome).
    Duplicate,
}

/// Balances and how far they have come.
#[derive(Clone, Debug)]
pub struct Ledger {
    balances: Vec<u64>,
    /// The last sequence applied (0: none).
    applied_seq: u64,
    /// The highest command id applied: commands arrive in id order, so every id up to it is
    /// in the log, and a re-sent one is recognised without keeping a set of ids.
    applied_command: u64,
    rejected: u64,
}

impl Ledger {
    pub fn new(accounts: u32, initial_balance: u64) -> Ledger {
        assert!(accounts >= 2, "a transfer needs two accounts");
        Ledger { balances: vec![initial_balance; accounts as usize], applied_seq: 0, applied_command: 0, rejected: 0 }
    }

    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    pub fn applied_command(&self) -> u64 {
        self.applied_command
    }

    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// The leader's step: `None` when the command was applied already (a re-send after a
    /// failover), else the numbered, applied transaction.
    pub fn decide(&mut self, transfer: Transfer) -> Result<Option<Transaction>, LedgerError> {
        if transfer.command <= self.applied_command {
            return Ok(None);
        }
        if transfer.command != self.applied_command + 1 {
            return Err(LedgerError::CommandGap { expected: self.applied_command + 1, got: transfer.command });
        }
        let seq = self.applied_seq + 1;
        let accepted = self.apply(seq, transfer)?;
        Ok(Some(Transaction { seq, transfer, accepted }))
    }

    /// The standby's step: applies the next logged transaction, skips one applied already,
    /// refuses a gap or an outcome these balances do not reproduce.
    pub fn replay(&mut self, transaction: &Transaction) -> Result<Replayed, LedgerError> {
        if transaction.seq <= self.applied_seq {
            return Ok(Replayed::Duplicate);
        }
        if transaction.seq != self.applied_seq + 1 {
            return Err(LedgerError::Gap { expected: self.applied_seq + 1, got: transaction.seq });
        }
        // Checked before anything changes, so a refusal leaves the ledger as it was.
        let accepted = self.outcome(transaction.seq, transaction.transfer)?;
        if accepted != transaction.accepted {
            return Err(LedgerError::OutcomeDiffers { seq: transaction.seq, logged: transaction.accepted });
        }
        self.apply(transaction.seq, transaction.transfer)?;
        Ok(Replayed::Applied)
    }

    /// Whether `transfer`, as sequence `seq`, would move money from these balances.
    fn outcome(&self, seq: u64, transfer: Transfer) -> Result<bool, LedgerError> {
        let accounts = self.balances.len() as u32;
        for account in [transfer.from, transfer.to] {
            if account >= accounts {
                return Err(LedgerError::UnknownAccount { seq, account });
            }
        }
        Ok(transfer.from != transfer.to && self.balances[transfer.from as usize] >= transfer.amount)
    }

    /// Applies `transfer` as sequence `seq`: whether it moved money.
    fn apply(&mut self, seq: u64, transfer: Transfer) -> Result<bool, LedgerError> {
        let accepted = self.outcome(seq, transfer)?;
        if accepted {
            self.balances[transfer.from as usize] -= transfer.amount;
            self.balances[transfer.to as usize] += transfer.amount;
        } else {
            self.rejected += 1;
        }
        self.applied_seq = seq;
        self.applied_command = self.applied_command.max(transfer.command);
        Ok(accepted)
    }

    /// The sum of every balance: transfers conserve it.
    pub fn sum(&self) -> u64 {
        self.balances.iter().sum()
    }

    /// A digest of every balance in account order (FNV-1a over their little-endian bytes):
    /// two ledgers with the same digest hold the same balances, for the gate's comparison.
    pub fn digest(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for balance in &self.balances {
            for byte in balance.to_le_bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }

    /// One account's balance (tests).
    #[cfg(test)]
    fn balance(&self, account: u32) -> u64 {
        self.balances[account as usize]
    }
}

/// One record of the transaction log, as JSON: `{"e":epoch,"tx":[[seq,command,from,to,amount,accepted],…]}`
/// for transactions, `{"e":epoch,"takeover":seq}` for a standby taking over after `seq`.
/// `e` fences a dead leader: once a takeover of epoch `e` is in the log, records of lower
/// epochs after it are ignored by every reader.
#[derive(Debug, Deserialize)]
pub struct RecordValue {
    pub e: u64,
    #[serde(default)]
    pub tx: Vec<(u64, u64, u32, u32, u64, u8)>,
    #[serde(default)]
    pub takeover: Option<u64>,
}

impl RecordValue {
    pub fn transactions(&self) -> impl Iterator<Item = Transaction> + '_ {
        self.tx.iter().map(|&(seq, command, from, to, amount, accepted)| Transaction {
            seq,
            transfer: Transfer { command, from, to, amount },
            accepted: accepted != 0,
        })
    }
}

/// Appends one NDJSON envelope holding `transactions` (of epoch `epoch`) to `body`.
pub fn encode_record(body: &mut String, epoch: u64, transactions: &[Transaction]) {
    write!(body, "{{\"value\":{{\"e\":{epoch},\"tx\":[").expect("writing to a String");
    for (index, transaction) in transactions.iter().enumerate() {
        let Transaction { seq, transfer, accepted } = transaction;
        let separator = if index == 0 { "" } else { "," };
        write!(
            body,
            "{separator}[{seq},{},{},{},{},{}]",
            transfer.command, transfer.from, transfer.to, transfer.amount, *accepted as u8
        )
        .expect("writing to a String");
    }
    body.push_str("]}}\n");
}

/// The NDJSON envelope of a takeover marker.
pub fn encode_takeover(epoch: u64, after_seq: u64) -> String {
    format!("{{\"value\":{{\"e\":{epoch},\"takeover\":{after_seq}}}}}\n")
}

/// The commands a run sends, drawn from a seed (splitmix64), so every run at a rate sends the
/// same transfers and reaches the same balances.
#[derive(Clone, Debug)]
pub struct Commands {
    state: u64,
    accounts: u32,
    amount_max: u64,
}

impl Commands {
    pub fn new(seed: u64, accounts: u32, amount_max: u64) -> Commands {
        assert!(accounts >= 2 && amount_max >= 1);
        Commands { state: seed, accounts, amount_max }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Command `command` (the next one: ids are drawn in order).
    pub fn draw(&mut self, command: u64) -> Transfer {
        let from = (self.next_u64() % u64::from(self.accounts)) as u32;
        // Never to itself: `to` is one of the other accounts.
        let to =
            ((u64::from(from) + 1 + self.next_u64() % u64::from(self.accounts - 1)) % u64::from(self.accounts)) as u32;
        let amount = 1 + self.next_u64() % self.amount_max;
        Transfer { command, from, to, amount }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(command: u64, from: u32, to: u32, amount: u64) -> Transfer {
        Transfer { command, from, to, amount }
    }

    #[test]
    fn the_leader_numbers_commands_and_applies_each_id_once() {
        let mut ledger = Ledger::new(3, 100);
        let first = ledger.decide(transfer(1, 0, 1, 30)).unwrap().unwrap();
        assert_eq!((first.seq, first.accepted), (1, true));
        let second = ledger.decide(transfer(2, 1, 2, 130)).unwrap().unwrap();
        assert_eq!((second.seq, second.accepted), (2, true));
        // Re-sent after a failover: recognised, not numbered again.
        assert_eq!(ledger.decide(transfer(1, 0, 1, 30)).unwrap(), None);
        assert_eq!(ledger.decide(transfer(2, 1, 2, 130)).unwrap(), None);
        assert_eq!((ledger.balance(0), ledger.balance(1), ledger.balance(2)), (70, 0, 230));
        assert_eq!(ledger.applied_seq(), 2);
        // A command skipped on the way is an error, not a silent hole.
        assert_eq!(ledger.decide(transfer(4, 0, 1, 1)), Err(LedgerError::CommandGap { expected: 3, got: 4 }));
    }

    #[test]
    fn an_overdraft_is_a_rejected_transaction_that_still_takes_a_sequence() {
        let mut ledger = Ledger::new(2, 50);
        let rejected = ledger.decide(transfer(1, 0, 1, 51)).unwrap().unwrap();
        assert_eq!((rejected.seq, rejected.accepted), (1, false));
        assert_eq!((ledger.balance(0), ledger.balance(1), ledger.rejected()), (50, 50, 1));
        let exact = ledger.decide(transfer(2, 0, 1, 50)).unwrap().unwrap();
        assert_eq!((exact.seq, exact.accepted), (2, true));
        assert_eq!((ledger.balance(0), ledger.balance(1)), (0, 100));
        assert_eq!(ledger.sum(), 100);
    }

    #[test]
    fn the_standby_replays_in_order_skips_duplicates_and_refuses_gaps_and_disagreement() {
        let mut leader = Ledger::new(4, 100);
        let mut commands = Commands::new(7, 4, 150);
        let log: Vec<Transaction> =
            (1..=200).map(|command| leader.decide(commands.draw(command)).unwrap().unwrap()).collect();
        assert!(leader.rejected() > 0, "the draw overdraws sometimes");
        let mut standby = Ledger::new(4, 100);
        for transaction in &log[..100] {
            assert_eq!(standby.replay(transaction), Ok(Replayed::Applied));
        }
        // A batch committed twice: its second copy changes nothing.
        for transaction in &log[90..100] {
            assert_eq!(standby.replay(transaction), Ok(Replayed::Duplicate));
        }
        assert_eq!(standby.replay(&log[101]), Err(LedgerError::Gap { expected: 101, got: 102 }));
        let mut forged = log[100];
        forged.accepted = !forged.accepted;
        assert_eq!(standby.replay(&forged), Err(LedgerError::OutcomeDiffers { seq: 101, logged: forged.accepted }));
        // Refusals leave the standby where it was.
        assert_eq!(standby.applied_seq(), 100);
        for transaction in &log[100..] {
            assert_eq!(standby.replay(transaction), Ok(Replayed::Applied));
        }
        assert_eq!(standby.digest(), leader.digest());
        assert_eq!(standby.sum(), 400);
        assert_eq!(standby.applied_command(), 200);
        // One balance apart, the digests differ.
        let mut other = standby.clone();
        other.balances[0] += 1;
        assert_ne!(other.digest(), standby.digest());
    }

    #[test]
    fn records_round_trip_through_their_json() {
        let mut ledger = Ledger::new(10, 1_000);
        let transactions: Vec<Transaction> =
            (1..=3).map(|command| ledger.decide(transfer(command, command as u32, 9, 400)).unwrap().unwrap()).collect();
        let mut body = String::new();
        encode_record(&mut body, 2, &transactions);
        let envelope: serde_json::Value = serde_json::from_str(body.trim_end()).unwrap();
        let value: RecordValue = serde_json::from_value(envelope["value"].clone()).unwrap();
        assert_eq!(value.e, 2);
        assert_eq!(value.transactions().collect::<Vec<_>>(), transactions);
        let marker: serde_json::Value = serde_json::from_str(encode_takeover(3, 41).trim_end()).unwrap();
        let marker: RecordValue = serde_json::from_value(marker["value"].clone()).unwrap();
        assert_eq!((marker.e, marker.takeover, marker.tx.len()), (3, Some(41), 0));
    }
}
